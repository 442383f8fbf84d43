//! Token buckets: the state of one bucket limit of one entity (a GCRA theoretical arrival
//! time), its decision, and global mode's sync of it.
//!
//! # The bucket
//! A bucket of capacity `burst` refills `requests_per_unit` tokens per window (`unit` ×
//! `unit_multiplier`): one token every `T = window / requests_per_unit` (whole nanoseconds,
//! at least 1). It starts full. Its whole state is the *theoretical arrival time* `tat`
//! (Unix ns): the moment it is full again (at or before now: full). The tokens owed at `now`
//! are `(tat − now) / T`; a request of `h` tokens fits when `tat − now + h·T ≤ burst·T`, and
//! spending them sets `tat = max(tat, now) + h·T`. Whole or nothing: a request that does not
//! fit takes no token (unless the limit is `strict`, when the denied tokens are owed too,
//! down to one capacity below empty — a client that keeps flooding stays denied until it
//! slows below the refill rate). A refund (`is_negative_hits`) gives tokens back, never
//! past full. 8 bytes in local mode, as GCRA promises; the rest is global mode's.
//!
//! # Global mode
//! The fleet's bucket is one `tat` in the store, plus a running count of tokens spent (for
//! measuring rates). Each sync sends the tokens this node spent since its last one; the store
//! counts them all and spends the last run of them, those spent since this node last saw the
//! bucket full, as one spend from the first of the run (`tat = max(tat, since) + n·T`), and
//! returns both values. The earlier ones were refilled before that moment: spent again on
//! top of the others' later spends, a warm bucket's trickle read as debt under a flood. A node
//! decides from the fleet's `tat` as last read plus its own spends since (its *view*), with
//! the same three guards as a window (`window/share.rs`, `window/prior.rs`):
//! - **young** (no reply yet, or the first one less than a tick old): with no reply, the
//!   node acts as a bucket of its own of `1.05 × burst / live` tokens refilling at
//!   `1.05 × rate / live`; with one, it spends since that reply at most its even share of the
//!   room the reply left, with a binomial spread. Running into its prior within 100 ms of
//!   its first reply, it asks for *burst reads* a round trip apart (`burst.rs`), so a
//!   burst is split on what the fleet has left, not on the prior;
//! - **settled**: it spends, since its last reply, its share of the room the fleet's bucket
//!   has had since then — the tokens left at the read, less the others' spends not sent yet
//!   then, plus the whole refill since (a fleet that keeps spending keeps the bucket from
//!   filling; after a pause, up to a full bucket) — plus three binomial deviations, at most
//!   its share again, and less when the others spend far above the refill (`FLOOD_PACE`).
//!   Its share is its part of the fleet's recent spending, measured between replies from the
//!   running count (averaged over at most 10 s), at least its even share `1 / live`. A
//!   bucket spent a bucketful per sync interval syncs every tick (`pressure_ahead`), however
//!   full it stays.
//!   Once it spent an eighth of that (or of its even share of the room, if less), or when it
//!   would deny a hit while the bucket refilled since its read, it asks for a *settled burst
//!   read* (`burst.rs`): a fleet flooded everywhere at once re-splits the room a round
//!   trip later instead of each node spending its spread before the next tick shows the
//!   others';
//! - **alone** (one live replica): exact.
//!
//! ```
//! use sluice::core::clock::UnixMillis;
//! use sluice::core::decide::{decide, Count};
//! use sluice::core::{Algorithm, Limit, LimitState};
//!
//! // 10 a second, bursts of 30; a lenient limit (denied tokens cost nothing).
//! let limit = Limit { requests_per_unit: 10, window_ms: 1000, algorithm: Algorithm::TokenBucket { burst: 30 } };
//! let mut b = [LimitState::restored(&limit, None)];
//! let mut admitted = |t| {
//!     let count = Count::Yes { hold_within: false };
//!     let mut hit = || decide([(&limit, false)], &mut b, t, 1, count, None).unwrap().outcome;
//!     (0..40).filter(|_| !hit().over).count()
//! };
//! let t = UnixMillis::from_secs(600);
//! assert_eq!(admitted(t), 30);
//! assert_eq!(admitted(t.plus_millis(1000)), 10);
//! ```

use super::clock::UnixMillis;
use super::fleet_view::{FleetView, MIN_SAMPLE_MS, PRIOR_SLACK};
pub use super::gcra::Geometry;
use super::gcra::{self, NS_PER_MS};
use super::limit::{Limit, Verdict, MAX_COUNT};

/// How much of the others' expected unsent spends (half a gap's worth at their rate) a node
/// keeps out of the room it shares (as for windows, `window/share.rs`).
const UNSENT_RESERVED: f64 = 0.75;

/// The smallest share of the room a node keeps, so a node that was quiet for a while can
/// still admit (its share would never grow back otherwise).
const SHARE_FLOOR: f64 = 1.0 / 64.0;

/// How many standard deviations of a binomial share a settled node may spend above its
/// share of the room: `sqrt(share × room)` tokens each. An entity's requests land on the
/// replicas in binomial shares, so a node that keeps strictly to its share denies hits
/// while another still has room; the spread is what lets the bursty-human scenarios through.
/// The fleet may overspend by the sum of the spreads, once: the next reads show the debt
/// and the room shrinks by it. In the simulator (six seeds; 20 replicas): with no spread,
/// bursty human traffic was falsely denied 3.0–4.4 % (per minute) and steady 2× 2.0–2.3 %;
/// with 2 deviations scaled by how full the bucket was read 2.5–4.0 % and 2.1–2.3 %;
/// with 3 unscaled 0–0.4 % and 1.8–2.0 %, at 1.01–1.08× the exact bucket; with 4,
/// no better, and up to 1.09×.
const SHARE_SPREAD: f64 = 3.0;

/// The least share a settled node keeps, as a part of its even share `1 / live`. A load
/// balancer spreads an entity's requests over the replicas at random, so a node's measured
/// share of a bursty entity's spends is mostly noise: a node that drew few hits of the last
/// bursts would keep a share near 0 and deny the next burst's. In the simulator (six seeds,
/// with settled burst reads), bursty human traffic at 20 replicas was falsely denied
/// 1.8–5.4 % with no even floor (only [`SHARE_FLOOR`]), 1.4–2.6 % with half the even share,
/// 1.1–2.0 % with all of it (the warm flood at 20: 1.038–1.091× the exact bucket without
/// it, 1.057–1.105× with it; the other scenarios within 0.5 points either way). The price:
/// the floored shares add up to more than 1 when the measured ones are uneven, which the
/// burst reads of a flood take back (`burst.rs`).
const EVEN_FLOOR: f64 = 1.0;

/// The time constant (ms) of the spend rates a share is measured from, at least: long enough
/// that a few tokens a tick do not make a node's share jump between 0 and 1, short enough to
/// follow traffic moving between replicas within a few seconds. A bucket that fills more
/// slowly than this averages over its fill time, up to [`RATE_TAU_MAX_MS`].
const RATE_TAU_MS: f64 = 2_000.0;

/// The longest time constant of the spend rates: a bucket of 100 an hour fills in 100 hours,
/// and rates averaged over that never move, so a node's share would stay what the first
/// minutes measured however the traffic moved since. The simulator's buckets fill within
/// 6 s, so it does not change them.
const RATE_TAU_MAX_MS: f64 = 10_000.0;

/// How fast the others may spend (their pace between the last two replies), as a multiple of
/// the refill rate, before a settled node's spread above its share shrinks in proportion:
/// others spending 100× the refill leave it 8 % of its spread. Spread lets a node take the
/// hits the binomial split sent it beyond its share while the fleet's demand is near the
/// room; in a flood every node has hits for its share and more, so the spread is only
/// overspending before the next read. In the
/// simulator (six seeds, with runs absorbed, [`ABSORB_PACE`]): without it the warm flood
/// admitted 1.158–1.187× the exact bucket at 20 replicas and 1.062–1.081× at 4; at 8,
/// 1.091–1.124× and 1.010–1.043×, the other scenarios unchanged; at 4, 1.086–1.115× with
/// bursty human traffic at 20 falsely denied up to 2.4 % (2.0 % at 8); at 1, 1.081–1.110×
/// and up to 3.1 %.
const FLOOD_PACE: f64 = 8.0;

/// How fast the fleet may spend, as a part of the refill rate, for a node to take the
/// bucket as full on its own view and the others' measured rate (a new run: its earlier
/// pending spends were refilled, `BucketPlan::spend`). In the simulator (six seeds), at 0.75
/// steady 2× at 4 replicas admitted up to 1.024× the exact bucket (runs absorbed while the
/// rates measured in the young phase lagged the fleet's ramp), at 0.6 1.012×; with no such
/// bound steady 2× at 20 admitted up to 1.039× (1.002× before runs).
const ABSORB_PACE: f64 = 0.6;

/// What one sync of a bucket sends: the tokens this node spent since its last sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketPlan {
    /// Tokens spent since the last sync, for the fleet's running count (negative: refunds).
    pub delta: i64,
    /// The last of them that still weigh on the bucket: those spent since this node last
    /// saw the fleet's bucket full (its *run*). The earlier ones were refilled before that
    /// moment, as the exact bucket absorbs them, so the store counts them but does not spend
    /// them again on top of spends that came later (a warm bucket's trickle stacked onto a
    /// flood read as debt).
    pub spend: i64,
    /// When the first of the run's tokens was spent (Unix ms): the store spends them from
    /// then, not from the sync's time, so a node alone stays exact (a bucket that was full
    /// then and is not by the time of the sync has not refilled for them yet).
    pub since_ms: u64,
    /// The fleet's `tat` as this node last read it (Unix µs, 0: never): a store that lost
    /// the bucket (Redis restarted empty) restores it to at least this.
    pub floor_us: u64,
    /// Every token this node has spent in the bucket so far and every token it gave back,
    /// sent or not, each modulo 2^32. Both only grow: the store keeps per replica the larger
    /// of what it applied and what a call states, and applies the difference in place of
    /// `delta`, so a call that timed out but ran and is then sent again, a late duplicate or
    /// two calls applied out of order spend nothing twice.
    pub stated: [u32; 2],
    /// A burst read (`window/prior.rs`): its reply measures rates however soon it comes.
    pub burst: bool,
}

/// The state of one token-bucket limit of one entity (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BucketState {
    /// This node's view of the bucket (Unix ns): local mode's exact `tat`; in global mode the
    /// fleet's as last read, with this node's spends since applied.
    tat: u64,
    /// The fleet's `tat` as last read (Unix ns; 0 before the first reply).
    remote: u64,
    /// While young: this node's own bucket of its prior share (Unix ns).
    own_tat: u64,
    /// The fleet's running count of tokens spent, as last read.
    spent_read: u64,
    /// Own tokens not sent yet (negative: refunds).
    pending: i64,
    /// Own tokens sent and not acknowledged yet.
    inflight: i64,
    /// The pending tokens spent since the fleet's bucket was last seen full (the run that
    /// [`BucketPlan::spend`] sends).
    pending_spend: i64,
    /// When the first of the run's pending tokens was spent (Unix ms; 0: none pending).
    pending_since: u64,
    /// Tokens spent and given back so far, wrapping ([`BucketPlan::stated`]).
    counted: [u32; 2],
    /// When the last reply arrived (Unix ms; 0 before the first).
    synced_at: u64,
    /// The other nodes' spends per second, averaged over [`RATE_TAU_MS`].
    others_per_sec: f32,
    /// This node's acknowledged spends per second, averaged the same way.
    own_per_sec: f32,
    /// The other nodes' spends per second between the last two replies, not averaged: what
    /// a young bucket's burst reads project over the round trip they lag (`burst.rs`).
    others_pace: f32,
    /// Time between the last two replies (ms, saturating); 0 until there were two.
    gap_ms: u16,
    /// Time from the first reply to the last (ms, saturating).
    age_ms: u16,
}

// === impl BucketState ===

impl BucketState {
    /// Checks `hits` tokens at `now` without spending them.
    pub fn check_with(
        &self,
        limit: &Limit,
        now: UnixMillis,
        hits: u64,
        fleet: &FleetView,
    ) -> Verdict {
        let g = Geometry::of(limit);
        let now_ns = now.0.saturating_mul(NS_PER_MS);
        let need = g.span(hits);
        let view = gcra::owed(self.tat, now_ns);
        let estimate = view
            .saturating_add(self.others_since(&g, now, fleet))
            .min(g.max_ahead_ns.max(view));
        let over = limit.requests_per_unit == 0
            || !gcra::fits(&g, view, need)
            || self.over_prior(&g, now, hits, fleet)
            || self.over_share(&g, now, hits, fleet);
        let after = estimate.saturating_add(need);
        let reported = if over { estimate } else { after };
        // When over: the time until the fleet's bucket (as estimated) holds these tokens, or,
        // for more tokens than it ever holds, until it is full.
        let retry_ns = if need > g.capacity_ns {
            estimate
        } else {
            after.saturating_sub(g.capacity_ns)
        };
        Verdict {
            count_after: g.tokens_up(after).min(MAX_COUNT),
            over,
            remaining: if over {
                0
            } else {
                (g.capacity_ns.saturating_sub(after) / g.interval_ns).min(u64::from(u32::MAX))
                    as u32
            },
            reset_ms: reported.div_ceil(NS_PER_MS),
            retry_ms: if over {
                retry_ns.div_ceil(NS_PER_MS).max(1)
            } else {
                0
            },
        }
    }

    /// Spends `hits` tokens at `now` (debt bounded at one capacity below empty).
    pub fn record_with(&mut self, limit: &Limit, now: UnixMillis, hits: u64, fleet: &FleetView) {
        let g = Geometry::of(limit);
        let now_ns = now.0.saturating_mul(NS_PER_MS);
        if self.seen_full(&g, now, fleet) {
            // Whatever this node spent before has been refilled: a new run starts.
            self.pending_spend = 0;
        }
        self.tat = gcra::spend(self.tat, now_ns, now_ns, g.span(hits), g.max_ahead_ns);
        if self.young(fleet) {
            let own = own_geometry(&g, fleet);
            self.own_tat = gcra::spend(
                self.own_tat,
                now_ns,
                now_ns,
                own.span(hits),
                own.max_ahead_ns,
            );
        }
        let hits = hits.min(MAX_COUNT) as i64;
        if self.pending_spend == 0 {
            self.pending_since = now.0;
        }
        self.pending = self.pending.saturating_add(hits);
        self.pending_spend = self.pending_spend.saturating_add(hits);
        // Wrapping, as the store compares them: only differences within 2^31 matter.
        self.counted[0] = self.counted[0].wrapping_add(hits as u32);
    }

    /// Whether the fleet's bucket is full at `now` as far as this node can tell: its view
    /// (the fleet's `tat` as read, with this node's spends since) is, and so is that read
    /// with the others' spends since at their measured rate, spent from the read. Alone,
    /// exactly when the bucket is full. A fleet spending below the refill rate stays full,
    /// and its spends before this moment no longer weigh on it.
    fn seen_full(&self, g: &Geometry, now: UnixMillis, fleet: &FleetView) -> bool {
        let now_ns = now.0.saturating_mul(NS_PER_MS);
        // Until the others' rate was measured (two replies), in a fleet, the view holds
        // this node's spends and the read only.
        if self.tat > now_ns || (!self.warm() && fleet.live > 1) {
            return false;
        }
        // A fleet spending near the refill rate or above keeps the bucket from filling,
        // whatever a read a tick old shows; rates measured while it ramps up lag it.
        let pace = f64::from(self.others_per_sec) * fleet.rate_factor(self.synced_at)
            + f64::from(self.own_per_sec);
        if fleet.live > 1 && pace > ABSORB_PACE * g.refill_per_sec() {
            return false;
        }
        let read_ns = self.synced_at.saturating_mul(NS_PER_MS);
        self.remote
            .max(read_ns)
            .saturating_add(self.others_since(g, now, fleet))
            <= now_ns
    }

    /// Gives `hits` tokens back at `now`, never past full: to this node's view and, while
    /// young in `fleet`, to its own bucket too, which would deny on tokens already given back
    /// otherwise.
    pub fn refund_with(&mut self, limit: &Limit, now: UnixMillis, hits: u64, fleet: &FleetView) {
        let g = Geometry::of(limit);
        let now_ns = now.0.saturating_mul(NS_PER_MS);
        let owed = g.tokens_up(gcra::owed(self.tat, now_ns));
        let back = hits.min(owed);
        if back > 0 {
            self.tat = gcra::give_back(self.tat, now_ns, now_ns, g.span(back));
            if self.young(fleet) {
                let own = own_geometry(&g, fleet);
                self.own_tat = gcra::give_back(self.own_tat, now_ns, now_ns, own.span(back));
            }
            if self.pending_spend == 0 {
                self.pending_since = now.0;
            }
            self.pending = self.pending.saturating_sub(back as i64);
            self.pending_spend = self.pending_spend.saturating_sub(back as i64);
            self.counted[1] = self.counted[1].wrapping_add(back as u32);
        }
    }

    /// Tokens owed at `now` as this node sees them (0: full).
    pub fn owed(&self, limit: &Limit, now: UnixMillis) -> u64 {
        let g = Geometry::of(limit);
        g.tokens_up(self.tat.saturating_sub(now.0.saturating_mul(NS_PER_MS)))
    }

    /// Own tokens not sent yet.
    pub fn pending(&self) -> i64 {
        self.pending
    }

    /// Forgets what was spent (an operator's reset, `rls/reset.rs`): the bucket is full.
    /// The tokens spent and given back so far stay (`counted`), with those not sent yet:
    /// each sync states them whole, and the store applies only what they add.
    pub fn forget(&mut self) {
        self.tat = 0;
        self.remote = 0;
        self.own_tat = 0;
    }

    /// What an evicted entity must not forget (`table.rs`): when its bucket is full again
    /// (Unix ms, rounded up); `None` when it is full now, so a fresh state would decide the
    /// same. (Spends not sent yet are the sync's to keep: the table never evicts an entity a
    /// sync holds.)
    pub fn summary(&self, now: UnixMillis) -> Option<u64> {
        (self.tat > now.0.saturating_mul(NS_PER_MS)).then(|| self.tat.div_ceil(NS_PER_MS))
    }

    /// A bucket no fuller than one that is full again at `full_at_ms`: a returning entity's
    /// over-estimate. It is this node's view only, so in global mode it is never sent as this
    /// node's spends, and the first reply replaces it with the fleet's.
    pub fn restored(full_at_ms: u64) -> Self {
        BucketState {
            tat: full_at_ms.saturating_mul(NS_PER_MS),
            ..BucketState::default()
        }
    }

    /// Whether a sync has ever completed.
    pub fn ever_synced(&self) -> bool {
        self.synced_at != 0
    }

    /// Whether the rates were measured between two replies.
    pub fn warm(&self) -> bool {
        self.gap_ms != 0
    }

    /// Whether the first reply is at least `tick_ms` old.
    pub fn settled(&self, tick_ms: u64) -> bool {
        self.synced_at != 0 && u64::from(self.age_ms) >= tick_ms.min(u64::from(u16::MAX))
    }

    /// The share of the fleet's bucket used at `now` as estimated (0 full, 1 empty).
    pub fn pressure(&self, limit: &Limit, now: UnixMillis) -> f64 {
        self.pressure_ahead(limit, now, 0, 0)
    }

    /// The pressure expected `ahead_ms` after `now`: the debt now plus the fleet's spends
    /// over `ahead_ms` at its measured pace, the refill not taken off. A bucket spent at
    /// about its refill rate stays near full, yet its shares must follow who spends it: one
    /// spending a bucketful within a sync interval syncs every tick. (Less the refill, the
    /// bursty-human scenarios synced on the Idle interval, 16 s, and decided on reads that
    /// old: 26–45 % false denials at 20 replicas, against 5–12 % with this.)
    pub fn pressure_ahead(&self, limit: &Limit, now: UnixMillis, ahead_ms: u64, _: u64) -> f64 {
        let g = Geometry::of(limit);
        if g.capacity_ns == 0 || limit.requests_per_unit == 0 {
            return 0.0;
        }
        let view = self.tat.saturating_sub(now.0.saturating_mul(NS_PER_MS));
        let est = view.saturating_add(self.others_since(&g, now, &FleetView::ALONE));
        let net = f64::from(self.others_per_sec) + f64::from(self.own_per_sec);
        let ahead = net * g.interval_ns as f64 * ahead_ms as f64 / 1000.0;
        ((est as f64 + ahead.max(0.0)) / g.capacity_ns as f64).max(0.0)
    }

    /// Starts a sync: the pending tokens go in flight.
    pub fn begin_sync(&mut self) -> BucketPlan {
        let plan = BucketPlan {
            delta: self.pending,
            spend: self.pending_spend,
            since_ms: self.pending_since,
            floor_us: self.remote / 1000,
            stated: self.counted,
            burst: false,
        };
        self.inflight = self.inflight.saturating_add(self.pending);
        self.pending = 0;
        self.pending_spend = 0;
        self.pending_since = 0;
        plan
    }

    /// Completes a sync: `totals` are the fleet's `tat` (Unix µs) and running count of
    /// tokens spent after the plan's delta was applied, read at `now`.
    pub fn complete_sync(
        &mut self,
        limit: &Limit,
        plan: &BucketPlan,
        totals: [u64; 2],
        now: UnixMillis,
    ) {
        let g = Geometry::of(limit);
        let [tat_us, spent] = totals;
        self.inflight = self.inflight.saturating_sub(plan.delta);
        if self.synced_at != 0 {
            let span = now.0.saturating_sub(self.synced_at);
            // A running count below what was read means the store lost the bucket: no sample.
            let others = i128::from(spent) - i128::from(self.spent_read) - i128::from(plan.delta);
            if spent >= self.spent_read && (span >= MIN_SAMPLE_MS || (plan.burst && span >= 1)) {
                self.measure(
                    &g,
                    others.max(0) as f64,
                    plan.delta.max(0) as f64,
                    span,
                    now,
                );
            }
            let since = span.min(u64::from(u16::MAX)) as u16;
            self.age_ms = self.age_ms.saturating_add(since);
        }
        self.spent_read = spent;
        let now_ns = now.0.saturating_mul(NS_PER_MS);
        self.remote = tat_us.saturating_mul(1000);
        // The run's tokens only: the earlier pending ones were refilled before it began. (One
        // sync of an entity is in flight at a time, `global/sync/shard.rs`: this reply's tokens
        // are in the fleet's `tat`. Another's, were there one, would count whole.)
        let unacked = self.pending_spend.saturating_add(self.inflight).max(0) as u64;
        self.tat = gcra::spend(self.remote, now_ns, now_ns, g.span(unacked), g.max_ahead_ns);
        self.synced_at = now.0.max(1);
    }

    /// Abandons a sync that failed: its tokens become pending again, to be resent.
    pub fn fail_sync(&mut self, plan: &BucketPlan) {
        self.inflight = self.inflight.saturating_sub(plan.delta);
        self.pending = self.pending.saturating_add(plan.delta);
        // Its run's tokens too, even if a spend since found the bucket full (they were
        // refilled then): a failed sync is rare, and counting them again errs on the safe
        // side, as every pending token did before runs.
        if plan.spend != 0 {
            self.pending_spend = self.pending_spend.saturating_add(plan.spend);
            if plan.since_ms != 0 && (self.pending_since == 0 || plan.since_ms < self.pending_since)
            {
                self.pending_since = plan.since_ms;
            }
        }
    }

    /// Updates the spend rates with a reply `span_ms` after the last: the others spent
    /// `others` tokens meanwhile and this node `own`.
    fn measure(&mut self, g: &Geometry, others: f64, own: f64, span_ms: u64, now: UnixMillis) {
        let gap = now
            .0
            .saturating_sub(self.synced_at)
            .clamp(1, u64::from(u16::MAX)) as u16;
        let fill_ms = g.capacity_ns as f64 / NS_PER_MS as f64;
        let tau = RATE_TAU_MS.max(fill_ms).min(RATE_TAU_MAX_MS);
        let span = span_ms.max(1) as f64;
        let alpha = (span / (span + tau)) as f32;
        let sample = |n: f64| (n * 1000.0 / span) as f32;
        self.others_pace = sample(others);
        if self.gap_ms == 0 {
            // The first sample: nothing to average with.
            self.others_per_sec = sample(others);
            self.own_per_sec = sample(own);
        } else {
            self.others_per_sec += alpha * (sample(others) - self.others_per_sec);
            self.own_per_sec += alpha * (sample(own) - self.own_per_sec);
        }
        self.gap_ms = gap;
    }
}

/// Local mode's verdict on `hits` tokens of a bucket whose `tat` is `owed_ns` ahead of `now`
/// (0: full). Exact rules report the store's bucket with it (`rls/exact.rs`), so a status,
/// `Retry-After` included, reads the same whether the bucket lives here or in Redis.
pub fn verdict_owed(limit: &Limit, now: UnixMillis, owed_ns: u64, hits: u64) -> Verdict {
    let b = BucketState {
        tat: now.0.saturating_mul(NS_PER_MS).saturating_add(owed_ns),
        ..BucketState::default()
    };
    b.check_with(limit, now, hits, &FleetView::ALONE)
}

/// A young node's own bucket: its even share of the burst with [`PRIOR_SLACK`] (at least
/// one token), refilling at its even share of the rate with the same slack.
fn own_geometry(g: &Geometry, fleet: &FleetView) -> Geometry {
    let live = f64::from(fleet.live.max(1));
    let interval_ns = ((g.interval_ns as f64 * live / PRIOR_SLACK) as u64).max(1);
    let burst = fleet.prior(g.burst).min(u64::from(u32::MAX)) as u32;
    Geometry::new(interval_ns, burst)
}

mod burst;
mod share;

#[cfg(test)]
mod tests;
