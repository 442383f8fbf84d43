//! The pure decision core: window state for one limit of one entity and `decide`.
//!
//! No locks, no I/O, no clock reads: `now` is an argument, so every decision is reproducible
//! with a manual clock. Nothing here allocates.
//!
//! Two algorithms:
//! - **Sliding window** (default), the 2-epoch sliding window counter. With window `W`,
//!   `epoch = floor(now / W)` and `progress = (now mod W) / W`, the estimate is
//!   `floor(prev × (1 − progress)) + curr`. Only admitted hits are counted: counting denied
//!   hits would carry a rejected flood into the next window (through `prev`) and deny traffic
//!   that is within the limit there.
//! - **Fixed window** (`algorithm: fixed_window`), envoyproxy/ratelimit's windows: a counter per
//!   epoch that counts every hit, admitted or not, as the reference's `INCRBY` does.
//!
//! In both, a request of `hits` is over the limit when `count + hits > limit`; reaching the
//! limit exactly is within it, and a limit of 0 always denies.
//!
//! # Global mode: the accuracy trade-off
//! With Redis, decisions still never wait on the network: a node decides from the fleet's
//! count as of its last sync plus its own hits since, and learns what the other replicas did
//! only at its next sync. What this owns is keeping that staleness from turning into
//! over-admission (see [`WindowState`] for the details):
//! - **the room left is shared**: a node spends only its share of the room the limit has
//!   left (its part of the window's count), so however stale the reads, the fleet as a whole
//!   spends the room about once — many nodes hit by a surge at the same moment, or a Redis
//!   outage that lasts a whole window, included;
//! - **the others' rate is measured** between consecutive replies, extrapolated for the
//!   estimate a node reports, and used to reserve the others' hits not yet sent;
//! - **pressure tiers** ([`Tier`], [`SyncPolicy`]): entities near their limit sync every
//!   tick, cold ones at once and on the next tick again (to measure the rate), and an entity
//!   whose own traffic says it will be Hot before its next sync is Hot now.
//!
//! The price is a few false denials in the last moments before a limit is reached (a node
//! whose share is spent while another's is not), and at most one tick of traffic decided on
//! stale counts. `sluice simulate` (`simulate.rs`) measures both against DESIGN §9.

use crate::clock::UnixMillis;

/// How a limit counts hits over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// The 2-epoch sliding window counter (the default).
    #[default]
    SlidingWindow,
    /// Windows aligned to the epoch, reset at each boundary (envoyproxy/ratelimit's behaviour).
    FixedWindow,
}

/// One limit: `requests_per_unit` hits per window of `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Hits allowed per window.
    pub requests_per_unit: u32,
    /// Window length in milliseconds; never 0.
    pub window_ms: u64,
    /// How hits are counted.
    pub algorithm: Algorithm,
}

/// The outcome of checking `hits` against one limit at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The (estimated) count including these hits.
    pub count_after: u64,
    /// Whether the hits go over the limit.
    pub over: bool,
    /// Hits left in the window after these (0 when over).
    pub remaining: u32,
    /// Milliseconds until the current window ends (1..=W).
    pub reset_ms: u64,
}

/// Counts of one epoch, split by where they are in the sync pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    epoch: u64,
    /// The fleet's count as Redis last reported it (own acknowledged hits included).
    remote: u64,
    /// Own hits sent to Redis and not yet acknowledged.
    inflight: i64,
    /// Own hits not yet sent.
    pending: i64,
}

impl Slot {
    fn total(&self) -> u64 {
        (self.remote as i64 + self.inflight + self.pending).max(0) as u64
    }
}

/// Counters of one limit of one entity: the current epoch and the one before it.
///
/// In local mode only `pending` ever moves and decisions are exact. In global mode a sync
/// moves `pending` to `inflight` ([`WindowState::begin_sync`]) and the reply moves it into
/// `remote` ([`WindowState::complete_sync`]), so a node's own hits are counted exactly once
/// whether or not a sync is in flight.
///
/// # Other nodes' hits between syncs
/// A node learns what the rest of the fleet did only from sync replies.
///
/// - **The room left is shared.** The *room* is the limit minus the fleet's count as last
///   read, minus the others' hits not yet sent when it was read (see below). A node admits
///   only while its own hits since that read fit in its *share* of the room: its part of the
///   window's count as of that read (own acknowledged hits over the fleet's count, weighted
///   as the window weighs them). When every node does this the fleet as a whole spends the
///   room about once, however stale the reads: no surge of many nodes each spending the same
///   room at the same moment, no drift during a Redis outage (the share and the count read
///   stay put while the window drains), and a node that takes most of the traffic gets most
///   of the room. Being measured, shares need no count of live replicas and follow uneven
///   load; nor must they add up to exactly 1, because every read resets the room to the
///   truth (too large a sum shows as a count a little over the limit, too small as room left
///   unused until the next read). Two details keep small shares from wasting room: a node
///   takes its share of the room as it will be at its next read (in a sliding window, more of
///   the previous epoch will have drained out by then), and rounds it with an offset of its
///   own. A node that has not read yet has the whole room, as in local mode; it reads on the
///   next tick.
/// - **The others' rate is measured** between consecutive replies, over both epochs (so a
///   boundary in between loses nothing). It gives the estimate the node reports
///   (`count_after`, `remaining`) and the pressure that sets its sync tier: the count read
///   plus the rate times the time since, in the previous epoch up to its end and in the
///   current one since its start. It also sizes the others' hits not yet sent when the count
///   was read: they sync about as often as this node (the last gap between its replies), so
///   those hits are half a gap old on average. A first reply gives only a guess at the rate
///   (the others' hits since the epoch began); it counts as measured ([`WindowState::warm`])
///   from the second, and until then [`SyncPolicy::due`] syncs the entity every tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowState {
    slots: [Slot; 2],
    /// Own hits counted in each slot's epoch (acknowledged or not), for the share. Kept
    /// apart from `Slot` so the state stays small: a u32 would pad a slot to 40 bytes.
    own: [u32; 2],
    /// When the last sync reply arrived (Unix ms); 0 before the first.
    synced_at: u64,
    /// Other nodes' hits per second between the last two replies (after one reply: a guess).
    others_per_sec: f32,
    /// The time between replies (ms, saturating), following a shorter gap at once and a
    /// longer one slowly; 0 until there were two replies.
    gap_ms: u16,
}

/// What one sync sends and reads for one limit: the deltas of the current and previous epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// The current and the previous epoch.
    pub epochs: [u64; 2],
    /// Own hits to add to each epoch's counter (0: read only).
    pub deltas: [i64; 2],
}

/// Replies closer together than this give no rate sample: a handful of hits over a few
/// milliseconds says little about a rate.
const MIN_SAMPLE_MS: u64 = 100;

/// The smallest share of the room a node keeps. With a sliding window only admitted hits
/// count, so a node whose share fell to nothing (it had no traffic for a while) would never
/// admit again and its share would never grow back.
const SHARE_FLOOR: f64 = 1.0 / 64.0;

/// How much of the others' expected unsent hits (half a sync interval's worth at their rate)
/// a node keeps out of the room it shares. All of them would put the fleet at the limit
/// exactly, on average — and a fleet that shares the room out, rather than serving requests
/// first come first served, then denies in the last moments before the limit requests at
/// nodes whose share is spent while other nodes' shares are not (about 2 % of the limit in a
/// 10× surge, in the simulator). Three quarters trade about 3 % admitted over the limit in
/// such a surge's first window for a third fewer of those denials; both stay well within
/// DESIGN §9.
const UNSENT_RESERVED: f64 = 0.75;

/// `floor(prev × left / w)`, in u64 unless that overflows.
fn weigh(prev: u64, left: u64, w: u64) -> u64 {
    match prev.checked_mul(left) {
        Some(p) => p / w,
        None => (u128::from(prev) * u128::from(left) / u128::from(w)) as u64,
    }
}

// === impl WindowState ===

impl WindowState {
    fn count(&self, epoch: u64) -> u64 {
        let s = &self.slots[(epoch % 2) as usize];
        if s.epoch == epoch {
            s.total()
        } else {
            0
        }
    }

    fn newest_epoch(&self) -> u64 {
        self.slots[0].epoch.max(self.slots[1].epoch)
    }

    /// The slot of `epoch`, reset when it still holds an older epoch. A clock that stepped
    /// back gets the newest slot, so counts are kept rather than forgotten.
    fn slot_mut(&mut self, epoch: u64) -> &mut Slot {
        let epoch = epoch.max(self.newest_epoch());
        let i = (epoch % 2) as usize;
        if self.slots[i].epoch < epoch {
            self.reset(i, epoch);
        }
        &mut self.slots[i]
    }

    /// Opens slot `i` for `epoch`. Anything still there is two windows old: no estimate
    /// reads it any more.
    fn reset(&mut self, i: usize, epoch: u64) {
        self.slots[i] = Slot {
            epoch,
            ..Slot::default()
        };
        self.own[i] = 0;
    }

    /// The epoch an estimate at `now` reads. A clock that stepped back reads the newest counts
    /// rather than none.
    fn epoch_at(&self, limit: &Limit, now: UnixMillis) -> u64 {
        (now.0 / limit.window_ms).max(self.newest_epoch())
    }

    /// The window formula at `now` over the counts of `epoch - 1` and `epoch`.
    fn window(limit: &Limit, now: UnixMillis, epoch: u64, prev: u64, curr: u64) -> u64 {
        match limit.algorithm {
            Algorithm::FixedWindow => curr,
            Algorithm::SlidingWindow if epoch == 0 => curr,
            Algorithm::SlidingWindow => {
                let left = limit.window_ms - now.0 % limit.window_ms;
                weigh(prev, left, limit.window_ms) + curr
            }
        }
    }

    /// Per-epoch values of `epoch - 1` and `epoch` read through `f`, 0 for an epoch no slot
    /// holds.
    fn pair(&self, epoch: u64, f: impl Fn(usize, &Slot) -> u64) -> (u64, u64) {
        let at = |e: u64| {
            let i = (e % 2) as usize;
            if self.slots[i].epoch == e {
                f(i, &self.slots[i])
            } else {
                0
            }
        };
        (if epoch == 0 { 0 } else { at(epoch - 1) }, at(epoch))
    }

    /// Other nodes' hits expected since the last reply, in the epoch before `epoch` (up to its
    /// end) and in `epoch` (since its start), each at most the limit.
    fn extrapolated(&self, limit: &Limit, now: UnixMillis, epoch: u64) -> (u64, u64) {
        if self.synced_at == 0 || self.others_per_sec <= 0.0 {
            return (0, 0);
        }
        let start = epoch.saturating_mul(limit.window_ms);
        let from = self.synced_at;
        let curr_ms = now.0.saturating_sub(from.max(start));
        let prev_ms = start.saturating_sub(from.max(start.saturating_sub(limit.window_ms)));
        let per_ms = f64::from(self.others_per_sec) / 1000.0;
        let cap = u64::from(limit.requests_per_unit);
        let hits = |ms: u64| ((per_ms * ms as f64) as u64).min(cap);
        (hits(prev_ms), hits(curr_ms))
    }

    /// The fleet's count as this node estimates it at `now`, before any new hits: the count
    /// last read, own hits since, and the others' hits since extrapolated at their rate.
    fn estimate(&self, limit: &Limit, now: UnixMillis) -> u64 {
        let epoch = self.epoch_at(limit, now);
        let (prev, curr) = self.pair(epoch, |_, s| s.total());
        let (others_prev, others_curr) = self.extrapolated(limit, now, epoch);
        Self::window(limit, now, epoch, prev + others_prev, curr + others_curr)
    }

    /// What this node leaves of the room to the others, as hits to add to the count it knows:
    /// all of the room but its share (see [`WindowState`]).
    ///
    /// A share of a small room is rarely a whole number of hits, and rounding it the same way
    /// on every node would make the whole fleet wait (down) or each node take one more (up).
    /// Each node rounds with an offset of its own instead, drawn from the time of its last
    /// reply, so that over the fleet the rounding errors cancel out.
    fn reserve(&self, limit: &Limit, now: UnixMillis, epoch: u64) -> u64 {
        let share = self.share(limit, now, epoch);
        if share >= 1.0 {
            return 0;
        }
        let (read_prev, read_curr) = self.pair(epoch, |_, s| s.remote);
        let rpu = f64::from(limit.requests_per_unit);
        let read = Self::window(limit, now, epoch, read_prev, read_curr) as f64;
        // Until its next reply the node learns nothing new, so it may spend its share of the
        // room as it will be then (in a sliding window, more of the previous epoch will have
        // drained out) rather than wait for each hit's worth to drain — which, spread over
        // many nodes each with a fraction of a hit, would leave room unused.
        let end = (epoch + 1).saturating_mul(limit.window_ms) - 1;
        let next = UnixMillis(
            now.0
                .max(self.synced_at.saturating_add(u64::from(self.gap_ms)))
                .min(end),
        );
        let read_next = Self::window(limit, next, epoch, read_prev, read_curr) as f64;
        // The others' hits not sent yet when the count was read are spent already.
        let unsent =
            UNSENT_RESERVED * f64::from(self.others_per_sec) * f64::from(self.gap_ms / 2) / 1000.0;
        let room = (rpu - read_next - unsent).max(0.0);
        let offset =
            (self.synced_at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64 / (1u64 << 53) as f64;
        (rpu - read - share * room - offset).ceil().max(0.0) as u64
    }

    /// This node's share of the window's count as of the last reply: own acknowledged hits
    /// over the fleet's count, both weighted as the window weighs them. Own hits not yet
    /// acknowledged are left out on both sides, or a node cut off from Redis would see its
    /// share creep up to 1 as the fleet's last count drained out of the window. 1 before any
    /// reply (local mode).
    fn share(&self, limit: &Limit, now: UnixMillis, epoch: u64) -> f64 {
        // In floats: near the end of a window the weighted counts are small, and rounding
        // them would make the share jump.
        let weight = match limit.algorithm {
            Algorithm::FixedWindow => 0.0,
            Algorithm::SlidingWindow => {
                (limit.window_ms - now.0 % limit.window_ms) as f64 / limit.window_ms as f64
            }
        };
        let (read_prev, read_curr) = self.pair(epoch, |_, s| s.remote);
        let acked =
            |i: usize, s: &Slot| (i64::from(self.own[i]) - s.inflight - s.pending).max(0) as u64;
        let (own_prev, own_curr) = self.pair(epoch, acked);
        let read = read_prev as f64 * weight + read_curr as f64;
        if read <= 0.0 {
            return 1.0;
        }
        ((own_prev as f64 * weight + own_curr as f64) / read).clamp(SHARE_FLOOR, 1.0)
    }

    /// Checks `hits` at `now` without counting them.
    ///
    /// In local mode (never synced) the count is exact. In global mode `over` says whether
    /// the hits fit in this node's share of the room left, while `count_after` and
    /// `remaining` report the fleet's estimated count (see [`WindowState`]).
    pub fn check(&mut self, limit: &Limit, now: UnixMillis, hits: u64) -> Verdict {
        let epoch = self.epoch_at(limit, now);
        let (prev, curr) = self.pair(epoch, |_, s| s.total());
        let known = Self::window(limit, now, epoch, prev, curr);
        let (count_after, decision) = if self.synced_at == 0 {
            let count = known.saturating_add(hits);
            (count, count)
        } else {
            (
                self.estimate(limit, now).saturating_add(hits),
                (known + self.reserve(limit, now, epoch)).saturating_add(hits),
            )
        };
        let rpu = u64::from(limit.requests_per_unit);
        let over = rpu == 0 || decision > rpu;
        Verdict {
            count_after,
            over,
            remaining: if over {
                0
            } else {
                rpu.saturating_sub(count_after) as u32
            },
            reset_ms: limit.window_ms - now.0 % limit.window_ms,
        }
    }

    /// Counts `hits` at `now`. `admitted` says whether the request they belong to was let
    /// through: the sliding window counts only admitted hits, the fixed window every hit.
    pub fn record(&mut self, limit: &Limit, now: UnixMillis, hits: u64, admitted: bool) {
        if admitted || limit.algorithm == Algorithm::FixedWindow {
            let s = self.slot_mut(now.0 / limit.window_ms);
            s.pending = s.pending.saturating_add(hits as i64);
            let i = (s.epoch % 2) as usize;
            self.own[i] = self.own[i].saturating_add(hits.min(u64::from(u32::MAX)) as u32);
        }
    }

    /// Gives `hits` back to the current window (Envoy's `is_negative_hits`).
    pub fn refund(&mut self, limit: &Limit, now: UnixMillis, hits: u64) {
        let epoch = now.0 / limit.window_ms;
        let have = self.count(epoch) as i64;
        let s = self.slot_mut(epoch);
        // Never below zero overall; in global mode the negative delta reaches Redis too.
        let back = (hits as i64).min(have);
        s.pending -= back;
        let i = (s.epoch % 2) as usize;
        self.own[i] = self.own[i].saturating_sub(back.clamp(0, i64::from(u32::MAX)) as u32);
    }

    /// Hits counted in the current epoch, as this node sees them (before extrapolation).
    pub fn current_count(&mut self, limit: &Limit, now: UnixMillis) -> u64 {
        self.count(now.0 / limit.window_ms)
    }

    /// Own hits not yet sent, over both epochs.
    pub fn pending(&self) -> i64 {
        self.slots.iter().map(|s| s.pending).sum()
    }

    /// Whether a sync has ever completed.
    pub fn ever_synced(&self) -> bool {
        self.synced_at != 0
    }

    /// Whether the others' rate was measured between two replies.
    pub fn warm(&self) -> bool {
        self.gap_ms != 0
    }

    /// Other nodes' hits per second as last measured (a first guess after one reply).
    pub fn others_per_sec(&self) -> f64 {
        f64::from(self.others_per_sec)
    }

    /// Starts a sync at `now`: the pending hits of the current and previous epoch become
    /// in-flight, to be added to the fleet's counters by the store.
    pub fn begin_sync(&mut self, limit: &Limit, now: UnixMillis) -> SyncPlan {
        let epoch = now.0 / limit.window_ms;
        // A read of an entity this node has not counted yet still needs a slot to land in.
        self.slot_mut(epoch);
        if epoch > 0 {
            let i = ((epoch - 1) % 2) as usize;
            if self.slots[i].epoch < epoch - 1 {
                self.reset(i, epoch - 1);
            }
        }
        let mut plan = SyncPlan {
            epochs: [epoch, epoch.saturating_sub(1)],
            deltas: [0; 2],
        };
        for i in 0..2 {
            let s = &mut self.slots[(plan.epochs[i] % 2) as usize];
            if s.epoch == plan.epochs[i] && (i == 0 || epoch > 0) {
                plan.deltas[i] = s.pending;
                s.inflight += s.pending;
                s.pending = 0;
            }
        }
        plan
    }

    /// Completes a sync: `totals` are the fleet's counters of `plan.epochs` after the deltas
    /// were added, read at `now`. Measures the other nodes' rate from what they added since
    /// the previous reply.
    pub fn complete_sync(
        &mut self,
        limit: &Limit,
        plan: &SyncPlan,
        totals: [u64; 2],
        now: UnixMillis,
    ) {
        // Epoch 0 has no previous epoch: the plan names it twice.
        let epochs = if plan.epochs[0] == plan.epochs[1] {
            1
        } else {
            2
        };
        let mut others = 0i64;
        let mut whole = true;
        for (i, &total) in totals.iter().enumerate().take(epochs) {
            let s = &mut self.slots[(plan.epochs[i] % 2) as usize];
            if s.epoch != plan.epochs[i] {
                whole = false; // the window moved on; nothing left to settle
                continue;
            }
            s.inflight -= plan.deltas[i];
            // What the others added since the last reply (or since the slot was opened, when
            // the last reply predates the epoch).
            others += total as i64 - s.remote as i64 - plan.deltas[i];
            s.remote = s.remote.max(total);
        }
        if self.synced_at == 0 {
            // A first reply: the others' hits since the current epoch began give a first guess
            // at their rate (their traffic may have started a moment ago), used until the next
            // reply measures it; meanwhile the entity syncs every tick.
            let since = now
                .0
                .saturating_sub(plan.epochs[0].saturating_mul(limit.window_ms));
            let others = totals[0] as i64 - plan.deltas[0];
            if since >= MIN_SAMPLE_MS {
                self.others_per_sec = others.max(0) as f32 * 1000.0 / since as f32;
            }
        } else {
            // Those hits were made since the last reply, but never before the start of the
            // previous epoch, whose count is the oldest the reply holds.
            let from = self
                .synced_at
                .max(plan.epochs[epochs - 1].saturating_mul(limit.window_ms));
            let span_ms = now.0.saturating_sub(from);
            if whole && span_ms >= MIN_SAMPLE_MS {
                // The last interval's rate, not an average: it sizes hits of the last
                // moments, and a fleet reaching its limit slows down within one interval.
                self.others_per_sec = others.max(0) as f32 * 1000.0 / span_ms as f32;
                // Near the limit every node syncs every tick, and that is when the others'
                // unsent hits matter: follow a shorter gap at once, a longer one slowly.
                let gap = now
                    .0
                    .saturating_sub(self.synced_at)
                    .clamp(1, u64::from(u16::MAX)) as u16;
                self.gap_ms = if self.gap_ms == 0 || gap <= self.gap_ms {
                    gap
                } else {
                    self.gap_ms + (gap - self.gap_ms) / 8
                };
            }
        }
        self.synced_at = now.0.max(1);
    }

    /// Abandons a sync that failed: its deltas become pending again, to be resent.
    pub fn fail_sync(&mut self, plan: &SyncPlan) {
        for i in 0..2 {
            let s = &mut self.slots[(plan.epochs[i] % 2) as usize];
            if s.epoch == plan.epochs[i] {
                s.inflight -= plan.deltas[i];
                s.pending += plan.deltas[i];
            }
        }
    }

    /// The estimate at `now` as a share of the limit (0 for a zero limit).
    pub fn pressure(&self, limit: &Limit, now: UnixMillis) -> f64 {
        if limit.requests_per_unit == 0 {
            return 0.0;
        }
        self.estimate(limit, now) as f64 / f64::from(limit.requests_per_unit)
    }

    /// The pressure expected `ahead_ms` after `now` at the fleet's pace: the others' measured
    /// rate plus this node's own since the last reply — or, when more, this node's own rate
    /// scaled up by its share of the window's count. Traffic spread over many replicas rises
    /// on all of them at once, and each node sees its own rise a whole sync interval before
    /// the fleet's count shows the others'. `min_span_ms` (a tick) keeps a hit or two just
    /// after a reply from reading as a burst.
    pub fn pressure_ahead(
        &self,
        limit: &Limit,
        now: UnixMillis,
        ahead_ms: u64,
        min_span_ms: u64,
    ) -> f64 {
        if limit.requests_per_unit == 0 {
            return 0.0;
        }
        let epoch = self.epoch_at(limit, now);
        let since = now.0.saturating_sub(self.synced_at).max(min_span_ms).max(1);
        let unacked: i64 = self.slots.iter().map(|s| s.inflight + s.pending).sum();
        let own = unacked.max(0) as f64 * 1000.0 / since as f64;
        let share = self.share(limit, now, epoch);
        let fleet = (self.others_per_sec() + own).max(own / share);
        let ahead = fleet * ahead_ms as f64 / 1000.0;
        (self.estimate(limit, now) as f64 + ahead) / f64::from(limit.requests_per_unit)
    }
}

/// How close an entity is to its limit, which sets how often it syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Under 10 % of the limit.
    Idle,
    /// 10–50 %.
    Low,
    /// 50–80 %.
    Normal,
    /// Over 80 %.
    Hot,
}

impl Tier {
    /// The tier of a pressure (estimate / limit).
    pub fn of(pressure: f64) -> Tier {
        if pressure < 0.1 {
            Tier::Idle
        } else if pressure < 0.5 {
            Tier::Low
        } else if pressure <= 0.8 {
            Tier::Normal
        } else {
            Tier::Hot
        }
    }
}

/// When an entity syncs: every `tick_ms` the sync task looks at the entities with news, and
/// syncs those whose tier's interval has passed since their last sync. A sync both writes the
/// pending hits and reads the fleet's counts (one script per shard does both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPolicy {
    /// The tick of the sync task.
    pub tick_ms: u64,
    /// The base interval: Normal syncs this often, Low every 4×, Idle every 8×, Hot every tick.
    pub base_ms: u64,
}

impl Default for SyncPolicy {
    fn default() -> Self {
        SyncPolicy {
            tick_ms: 1000,
            base_ms: 2000,
        }
    }
}

impl SyncPolicy {
    /// How long an entity of `tier` waits between syncs.
    pub fn interval_ms(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Idle => 8 * self.base_ms,
            Tier::Low => 4 * self.base_ms,
            Tier::Normal => self.base_ms,
            Tier::Hot => self.tick_ms,
        }
    }

    /// Whether a limit state last synced at `last_sync_ms` is due at `now`.
    ///
    /// - Until the others' rate is known ([`WindowState::warm`]: never synced, or synced
    ///   once), every tick: a cold entity learns the fleet's count on the first tick after
    ///   its first hit and the others' rate on the next, which is what keeps a surge spread
    ///   over many nodes from running far past the limit before any node notices.
    /// - Then at its tier's interval — the tier the pressure is expected to reach by the end
    ///   of that interval ([`WindowState::pressure_ahead`]) when that is higher: an entity
    ///   that will be Hot before its next sync is Hot now.
    pub fn due(
        &self,
        state: &WindowState,
        limit: &Limit,
        now: UnixMillis,
        last_sync_ms: u64,
    ) -> bool {
        if !state.warm() {
            return true;
        }
        let elapsed = now.0.saturating_sub(last_sync_ms) + self.tick_ms / 2;
        let tier = Tier::of(state.pressure(limit, now));
        if elapsed >= self.interval_ms(tier) {
            return true;
        }
        let ahead = state.pressure_ahead(limit, now, self.interval_ms(tier), self.tick_ms);
        elapsed >= self.interval_ms(Tier::of(ahead).max(tier))
    }
}

/// Checks and counts `hits` against one limit at `now`.
///
/// ```
/// use sluice::clock::UnixMillis;
/// use sluice::limiter::{decide, Algorithm, Limit, WindowState};
///
/// let limit = Limit { requests_per_unit: 2, window_ms: 60_000, algorithm: Algorithm::FixedWindow };
/// let mut state = WindowState::default();
/// let t = UnixMillis::from_secs(600);
/// assert!(!decide(&mut state, &limit, t, 1).over);
/// assert_eq!(decide(&mut state, &limit, t, 1).remaining, 0);
/// assert!(decide(&mut state, &limit, t, 1).over);
/// assert!(!decide(&mut state, &limit, t.plus_millis(60_000), 1).over);
/// ```
pub fn decide(state: &mut WindowState, limit: &Limit, now: UnixMillis, hits: u64) -> Verdict {
    let verdict = state.check(limit, now, hits);
    state.record(limit, now, hits, !verdict.over);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    fn sliding(rpu: u32) -> Limit {
        Limit {
            requests_per_unit: rpu,
            window_ms: MIN,
            algorithm: Algorithm::SlidingWindow,
        }
    }

    fn fixed(rpu: u32) -> Limit {
        Limit {
            algorithm: Algorithm::FixedWindow,
            ..sliding(rpu)
        }
    }

    /// Start of some minute-aligned window.
    const T0: UnixMillis = UnixMillis(1_700_000_040_000);

    #[test]
    fn reaching_the_limit_exactly_is_ok_with_zero_left() {
        let mut s = WindowState::default();
        for left in (0..3).rev() {
            let v = decide(&mut s, &fixed(3), T0, 1);
            assert!(!v.over);
            assert_eq!(v.remaining, left);
        }
        let v = decide(&mut s, &fixed(3), T0, 1);
        assert!(v.over);
        assert_eq!((v.remaining, v.count_after), (0, 4));
    }

    #[test]
    fn reset_counts_down_to_one_ms_at_window_end() {
        let mut s = WindowState::default();
        assert_eq!(s.check(&fixed(1), T0, 0).reset_ms, MIN);
        assert_eq!(s.check(&fixed(1), T0.plus_millis(59_999), 0).reset_ms, 1);
        assert_eq!(s.check(&fixed(1), T0.plus_millis(60_000), 0).reset_ms, MIN);
    }

    #[test]
    fn fixed_window_resets_at_the_boundary_and_counts_denied_hits() {
        let mut s = WindowState::default();
        let l = fixed(2);
        for _ in 0..5 {
            decide(&mut s, &l, T0.plus_millis(59_000), 1);
        }
        assert_eq!(s.current_count(&l, T0.plus_millis(59_000)), 5);
        let v = decide(&mut s, &l, T0.plus_millis(60_000), 1);
        assert!(!v.over);
        assert_eq!(v.remaining, 1);
    }

    #[test]
    fn sliding_window_weights_the_previous_epoch_by_time_left() {
        let l = sliding(10);
        let mut s = WindowState::default();
        for _ in 0..10 {
            assert!(!decide(&mut s, &l, T0, 1).over);
        }
        assert!(decide(&mut s, &l, T0, 1).over, "the 11th hit is over");
        // A quarter into the next window, 75 % of the previous 10 still count: 7 (floored).
        let q = T0.plus_millis(MIN + MIN / 4);
        assert_eq!(s.check(&l, q, 0).count_after, 7);
        for _ in 0..3 {
            assert!(!decide(&mut s, &l, q, 1).over);
        }
        assert!(decide(&mut s, &l, q, 1).over);
        // Two windows later everything has aged out.
        assert_eq!(s.check(&l, T0.plus_millis(3 * MIN), 0).count_after, 0);
    }

    #[test]
    fn sliding_window_does_not_count_denied_hits() {
        let l = sliding(1);
        let mut s = WindowState::default();
        decide(&mut s, &l, T0, 1);
        for _ in 0..100 {
            assert!(decide(&mut s, &l, T0, 1).over);
        }
        // The denied flood does not weigh on the next window: only the 1 admitted hit does.
        let half = T0.plus_millis(MIN + MIN / 2);
        assert_eq!(s.check(&l, half, 0).count_after, 0);
    }

    #[test]
    fn zero_hits_checks_without_counting() {
        let mut s = WindowState::default();
        let l = fixed(1);
        for _ in 0..3 {
            let v = decide(&mut s, &l, T0, 0);
            assert!(!v.over);
            assert_eq!(v.remaining, 1);
        }
        decide(&mut s, &l, T0, 1);
        let v = decide(&mut s, &l, T0, 0);
        assert_eq!((v.over, v.remaining), (false, 0));
    }

    #[test]
    fn zero_limit_always_denies() {
        let mut s = WindowState::default();
        for hits in [0, 1, 5] {
            for l in [fixed(0), sliding(0)] {
                assert!(decide(&mut s, &l, T0, hits).over);
            }
        }
    }

    #[test]
    fn a_big_addend_is_denied_whole() {
        let mut s = WindowState::default();
        let l = sliding(10);
        assert!(!decide(&mut s, &l, T0, 8).over);
        let v = decide(&mut s, &l, T0, 5);
        assert!(v.over);
        // The denied 5 were not counted, so 2 more still fit.
        assert!(!decide(&mut s, &l, T0, 2).over);
    }

    #[test]
    fn a_clock_step_back_keeps_counts() {
        let mut s = WindowState::default();
        let l = fixed(1);
        decide(&mut s, &l, T0.plus_millis(MIN), 1);
        assert!(decide(&mut s, &l, T0, 1).over);
    }

    /// A fake fleet counter per epoch, as Redis would hold it.
    fn apply(store: &mut std::collections::HashMap<u64, u64>, plan: &SyncPlan) -> [u64; 2] {
        std::array::from_fn(|i| {
            let v = store.entry(plan.epochs[i]).or_default();
            *v = (*v as i64 + plan.deltas[i]) as u64;
            *v
        })
    }

    #[test]
    fn hits_during_a_sync_in_flight_are_counted_once() {
        let l = fixed(10);
        let mut s = WindowState::default();
        let mut store = std::collections::HashMap::new();
        for _ in 0..3 {
            decide(&mut s, &l, T0, 1);
        }
        let plan = s.begin_sync(&l, T0);
        assert_eq!(plan.deltas, [3, 0]);
        // Two more hits while the sync is in flight.
        decide(&mut s, &l, T0.plus_millis(10), 1);
        decide(&mut s, &l, T0.plus_millis(10), 1);
        assert_eq!(s.check(&l, T0.plus_millis(10), 0).count_after, 5);
        let totals = apply(&mut store, &plan);
        s.complete_sync(&l, &plan, totals, T0.plus_millis(20));
        assert_eq!(s.check(&l, T0.plus_millis(20), 0).count_after, 5);
        assert_eq!(s.pending(), 2);
        let plan = s.begin_sync(&l, T0.plus_millis(30));
        let totals = apply(&mut store, &plan);
        s.complete_sync(&l, &plan, totals, T0.plus_millis(40));
        assert_eq!(store[&(T0.0 / MIN)], 5);
        assert_eq!(
            (s.pending(), s.check(&l, T0.plus_millis(40), 0).count_after),
            (0, 5)
        );
    }

    #[test]
    fn a_failed_sync_is_resent() {
        let l = fixed(10);
        let mut s = WindowState::default();
        decide(&mut s, &l, T0, 4);
        let plan = s.begin_sync(&l, T0);
        s.fail_sync(&plan);
        assert_eq!((s.pending(), s.check(&l, T0, 0).count_after), (4, 4));
        assert_eq!(s.begin_sync(&l, T0).deltas, [4, 0]);
    }

    #[test]
    fn other_nodes_hits_are_read_and_extrapolated() {
        let l = fixed(1000);
        let mut s = WindowState::default();
        let mut store = std::collections::HashMap::new();
        // Others add 100 in the first 10 s of the window; our first sync sees them.
        *store.entry(T0.0 / MIN).or_default() += 100;
        let t = T0.plus_millis(10_000);
        let plan = s.begin_sync(&l, t);
        let totals = apply(&mut store, &plan);
        s.complete_sync(&l, &plan, totals, t);
        assert_eq!(s.check(&l, t, 0).count_after, 100);
        // 10 hits/s from others: 5 s later, 50 more are expected before the next read.
        assert_eq!(s.check(&l, t.plus_millis(5_000), 0).count_after, 150);
        // The next read replaces the guess with the truth.
        *store.entry(T0.0 / MIN).or_default() += 20;
        let t2 = t.plus_millis(5_000);
        let plan = s.begin_sync(&l, t2);
        let totals = apply(&mut store, &plan);
        s.complete_sync(&l, &plan, totals, t2);
        assert_eq!(s.check(&l, t2, 0).count_after, 120);
    }

    #[test]
    fn a_reply_after_the_window_moved_settles_the_previous_epoch() {
        let l = sliding(100);
        let mut s = WindowState::default();
        let mut store = std::collections::HashMap::new();
        let late = T0.plus_millis(MIN - 5);
        decide(&mut s, &l, late, 10);
        let plan = s.begin_sync(&l, late);
        // The reply arrives in the next window, after more hits there.
        let next = T0.plus_millis(MIN);
        decide(&mut s, &l, next, 1);
        let totals = apply(&mut store, &plan);
        s.complete_sync(&l, &plan, totals, next);
        // prev = 10 (acknowledged, weighted ~1), curr = 1 pending: nothing lost or doubled.
        assert_eq!(s.check(&l, next, 0).count_after, 10 + 1);
        assert_eq!(s.begin_sync(&l, next).deltas, [1, 0]);
    }

    // === global mode: fleet accuracy ===

    /// Syncs `s` with the fake store at `t` (the reply lands at once).
    fn sync(
        s: &mut WindowState,
        l: &Limit,
        store: &mut std::collections::HashMap<u64, u64>,
        t: UnixMillis,
    ) {
        let plan = s.begin_sync(l, t);
        let totals = apply(store, &plan);
        s.complete_sync(l, &plan, totals, t);
    }

    /// Decides single hits at `t` until one is denied; returns how many were admitted.
    fn admit_all(s: &mut WindowState, l: &Limit, t: UnixMillis) -> u64 {
        (0..10_000).take_while(|_| !decide(s, l, t, 1).over).count() as u64
    }

    #[test]
    fn each_node_spends_only_its_share_of_the_room_left() {
        let l = sliding(1000);
        let mut store = std::collections::HashMap::new();
        let (mut a, mut b) = (WindowState::default(), WindowState::default());
        let t = T0.plus_millis(10_000);
        // B counted 90 and synced; then A counted 10 and synced: A has 10 % of the count.
        decide(&mut b, &l, t, 90);
        sync(&mut b, &l, &mut store, t);
        decide(&mut a, &l, t, 10);
        sync(&mut a, &l, &mut store, t);
        // A reports the fleet's count, but spends only its share of the 900 left: 90 hits
        // (91 when its rounding offset says so).
        assert_eq!(a.check(&l, t, 1).remaining, 1000 - 101);
        let a_took = admit_all(&mut a, &l, t);
        assert!((90..=91).contains(&a_took), "{a_took}");
        // Once A's hits are sent, B's read shows about 190 of which 90 are B's: B takes its
        // 47 % of the 810 left, and the two together stay within the limit.
        sync(&mut a, &l, &mut store, t);
        sync(&mut b, &l, &mut store, t);
        let b_took = admit_all(&mut b, &l, t);
        let expected = 90 * (900 - a_took) / (100 + a_took);
        assert!((expected..=expected + 1).contains(&b_took), "{b_took}");
        assert!(100 + a_took + b_took <= 1000);
    }

    #[test]
    fn a_node_cut_off_from_the_store_keeps_to_its_share_as_the_window_drains() {
        let l = sliding(1000);
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        // The window ends full: 900 hits of other nodes and 100 of ours.
        *store.entry(T0.0 / MIN).or_default() += 900;
        let late = T0.plus_millis(MIN - 1_000);
        decide(&mut s, &l, late, 100);
        sync(&mut s, &l, &mut store, late);
        // Then the store is gone. Half-way through the next window half of the previous
        // epoch has drained: 500 hits of room for the fleet, of which this node takes its
        // 10 % — not all 500, which every node cut off would otherwise take.
        let half = T0.plus_millis(MIN + MIN / 2);
        let took = admit_all(&mut s, &l, half);
        assert!((49..=51).contains(&took), "{took}");
        // By the end of that window, its share of the whole limit.
        let end = T0.plus_millis(2 * MIN - 1);
        let more = admit_all(&mut s, &l, end);
        assert!((98..=101).contains(&(took + more)), "{took} + {more}");
    }

    #[test]
    fn the_others_rate_is_measured_between_replies_across_a_boundary() {
        let l = sliding(1000);
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        let t1 = T0.plus_millis(MIN - 500);
        decide(&mut s, &l, t1, 1);
        sync(&mut s, &l, &mut store, t1);
        assert!(!s.warm(), "a first reply only guesses the rate");
        // The others add 10 before the boundary and 10 after it.
        *store.entry(T0.0 / MIN).or_default() += 10;
        *store.entry(T0.0 / MIN + 1).or_default() += 10;
        let t2 = T0.plus_millis(MIN + 500);
        sync(&mut s, &l, &mut store, t2);
        assert!(s.warm());
        assert_eq!(s.others_per_sec(), 20.0);
        // Extrapolated between replies: 2 s later, 40 more (on top of 1 + 10 weighted ~1
        // in the previous epoch and 10 in this one).
        let later = t2.plus_millis(2_000);
        let weighted = (11 * (MIN - 2_500) / MIN) + 10;
        assert_eq!(s.check(&l, later, 0).count_after, weighted + 40);
    }

    #[test]
    fn a_cold_entity_syncs_every_tick_until_the_rate_is_known() {
        let l = sliding(1000);
        let policy = SyncPolicy::default();
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        let t = T0.plus_millis(5_000);
        decide(&mut s, &l, t, 1);
        assert!(policy.due(&s, &l, t, 0), "never synced");
        sync(&mut s, &l, &mut store, t);
        let tick = t.plus_millis(policy.tick_ms);
        assert!(
            policy.due(&s, &l, tick, t.0),
            "one reply: the rate is a guess"
        );
        sync(&mut s, &l, &mut store, tick);
        // Warm and idle: the next sync waits for the Idle interval.
        let next = tick.plus_millis(policy.tick_ms);
        assert!(!policy.due(&s, &l, next, tick.0));
        let idle = tick.plus_millis(policy.interval_ms(Tier::Idle));
        assert!(policy.due(&s, &l, idle, tick.0));
    }

    #[test]
    fn a_surge_seen_on_this_node_makes_the_entity_hot_before_the_count_shows_it() {
        let l = sliding(1000);
        let policy = SyncPolicy::default();
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        // A quiet entity: this node has 1 of the fleet's 20 hits, read twice 1 s apart.
        *store.entry(T0.0 / MIN).or_default() += 19;
        let t = T0.plus_millis(10_000);
        decide(&mut s, &l, t, 1);
        sync(&mut s, &l, &mut store, t);
        let t2 = t.plus_millis(1_000);
        sync(&mut s, &l, &mut store, t2);
        assert_eq!(Tier::of(s.pressure(&l, t2)), Tier::Idle);
        // Then 30 hits here within a tick: with its 5 % share of the count, the fleet is
        // likely to be taking about 600 a second — Hot within the Idle interval.
        let t3 = t2.plus_millis(policy.tick_ms);
        for _ in 0..30 {
            decide(&mut s, &l, t3, 1);
        }
        assert_eq!(Tier::of(s.pressure(&l, t3)), Tier::Idle);
        assert!(policy.due(&s, &l, t3, t2.0));
    }

    #[test]
    fn the_state_stays_small() {
        // Memory per entity is a DESIGN §9 target: the fleet-accuracy fields cost 8 bytes.
        assert!(std::mem::size_of::<WindowState>() <= 88);
    }
}
