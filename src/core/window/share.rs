//! Global mode's reading of a window state: the others' hits extrapolated at their measured
//! rate, the shared room near the limit, the re-reads of a surge, and pressure. The sync
//! accounting that feeds it is `sync.rs`.
//!
//! # The accuracy trade-off
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
//! - **pressure tiers** (`Tier`, `SyncPolicy`, `core/tier.rs`): entities near their limit sync every
//!   tick, cold ones at once and on the next tick again (to measure the rate), and an entity
//!   whose own traffic says it will be Hot before its next sync is Hot now.
//!
//! - **a sync is idempotent, and a store that restarts empty is rebuilt** (`sync.rs`).
//!
//! The price is a few false denials in the last moments before a limit is reached (a node
//! whose share is spent while another's is not), and at most one tick of traffic decided on
//! stale counts. `sluice simulate` (`sim/`) measures both against the targets (ARCHITECTURE.md, "Targets").

use super::{float, Limit, Slot, Span, WindowState};
use crate::core::clock::UnixMillis;
use crate::core::fleet_view::FleetView;

/// How much of the limit the others must add in a tick for a settled node to re-read the
/// count as it spends its share of the room ([`WindowState::read_due`]). The others' hits
/// a read misses are up to a tick of their traffic; where that is a good part of the limit
/// (a surge on a small limit: two replicas at 400 a second on 600 an hour), a share of the
/// room taken on such a read gives out room the others have spent already. In a steady
/// state at the limit the others add the window's drain, 1.7 % of a limit a minute in a
/// tick, and reads would cost round trips for nothing.
const SETTLED_FAST: f64 = 0.05;

/// How much of its share of the room a settled node in a surge spends before it re-reads
/// the count (a bucket's `SETTLED_READ_AT`, `bucket/burst.rs`): each read sends its hits
/// too, so the others' reads miss at most this much of each node's share.
const SETTLED_READ_AT: f64 = 0.125;

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
/// the targets (ARCHITECTURE.md, "Targets").
const UNSENT_RESERVED: f64 = 0.75;

// === impl WindowState ===

impl WindowState {
    /// Other nodes' hits expected since the last reply, in the epoch before `span`'s (up to
    /// its end) and in `span`'s (since its start), each at most the limit.
    /// `factor` scales the measured rate (replicas that left since: `prior.rs`).
    #[inline]
    pub(super) fn extrapolated(
        &self,
        limit: &Limit,
        now: UnixMillis,
        span: &Span,
        factor: f64,
    ) -> (u64, u64) {
        if self.synced_at == 0 || self.others_per_sec <= 0.0 || factor <= 0.0 {
            return (0, 0);
        }
        let start = span.start_ms;
        let from = self.synced_at;
        let curr_ms = now.0.saturating_sub(from.max(start));
        let prev_ms = start.saturating_sub(from.max(start.saturating_sub(limit.window_ms)));
        // A multiplication, not `/ 1000.0`: an f64 division is some 13 cycles on the
        // decision's critical path.
        let per_ms = f64::from(self.others_per_sec) * factor * 1e-3;
        let cap = f64::from(limit.requests_per_unit);
        // Back through i64, not u64: one instruction (the value is at most the limit). No
        // time, no hits: a reply in the current epoch (the usual case) leaves nothing to
        // extrapolate in the previous one, and saves the conversions.
        let hits = |ms: u64| {
            if ms == 0 {
                0
            } else {
                // A comparison, not `f64::min`, which also handles a NaN there cannot be.
                let h = per_ms * float(ms);
                (if h < cap { h } else { cap }) as i64 as u64
            }
        };
        (hits(prev_ms), hits(curr_ms))
    }

    /// The fleet's count as this node estimates it at `now`, before any new hits: the count
    /// last read, own hits since, and the others' hits since extrapolated at their rate.
    pub(super) fn estimate(&self, limit: &Limit, now: UnixMillis) -> u64 {
        let span = Span::new(limit, now, self.epoch_at(limit, now));
        let totals = self.pair(span.epoch, |_, s| s.total());
        self.estimate_on(limit, now, &span, 1.0, totals)
    }

    /// [`WindowState::estimate`] on the totals of `epoch - 1` and `epoch`, which a decision
    /// has read already, with the others' rate scaled by `factor`.
    #[inline]
    pub(super) fn estimate_on(
        &self,
        limit: &Limit,
        now: UnixMillis,
        span: &Span,
        factor: f64,
        (prev, curr): (u64, u64),
    ) -> u64 {
        let (others_prev, others_curr) = self.extrapolated(limit, now, span, factor);
        span.count(prev + others_prev, curr + others_curr)
    }

    /// Whether this node's share of the room is spent: whether what it leaves of the room to
    /// the others, added to `after` (the count it knows with the hits asked for, at most the
    /// limit), goes past the limit, the fleet's counts of `epoch - 1` and `epoch` as last read
    /// being `read_prev` and `read_curr`. All of the room but its share is left to them (see
    /// [`WindowState`]).
    ///
    /// A share of a small room is rarely a whole number of hits, and rounding it the same way
    /// on every node would make the whole fleet wait (down) or each node take one more (up).
    /// Each node rounds with an offset of its own instead, drawn from the time of its last
    /// reply, so that over the fleet the rounding errors cancel out.
    /// A node that has read a count of 0 has no measured share: it takes its prior one
    /// (`1 / live replicas`), and the others' rate counts only as far as `fleet` says it
    /// still applies.
    ///
    /// Left to the others, rounded up: `ceil(limit − read − share × room − offset)`, which
    /// is more than the whole number `limit − after` exactly when `after − read − offset >
    /// share × room`. With the share as the fraction `own / read` that is compared with both
    /// sides multiplied by `read`: no division and no rounding on a decision's critical path,
    /// which on a busy table starts when its state arrives from memory.
    #[inline]
    pub(super) fn over_room_share(
        &self,
        (limit, now, span, fleet): (&Limit, UnixMillis, &Span, &FleetView),
        factor: f64,
        (read_prev, read_curr): (u64, u64),
        after: u64,
    ) -> bool {
        let epoch = span.epoch;
        let rpu = f64::from(limit.requests_per_unit);
        let read = float(span.count(read_prev, read_curr));
        // The others' hits not sent yet when the count was read are spent already.
        let rate = f64::from(self.others_per_sec) * factor;
        let unsent = UNSENT_RESERVED * rate * f64::from(self.gap_ms / 2) * 1e-3;
        // Far from the limit, the usual case, the share needs no computing: this node's hits
        // since the read fit, with a hit to spare for rounding, in the least share it may have
        // (the floor, or the prior share if smaller) of the room as it is now (it only grows
        // until the next reply, as the previous epoch drains out).
        let least = SHARE_FLOOR.min(fleet.prior_share());
        if float(after) - read + 1.0 <= least * (rpu - read - unsent) {
            return false;
        }
        // The share as `own / of`, clamped as [`WindowState::share`] clamps it.
        let (own, of) = match self.share_parts(epoch, (read_prev, read_curr), span.weight()) {
            Some((own, read)) => (own.clamp(SHARE_FLOOR * read, read), read),
            None => (fleet.prior_share(), 1.0),
        };
        if own >= of {
            // The whole room is this node's: it leaves nothing to the others.
            return false;
        }
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
        let read_next = float(Self::window(limit, next, epoch, read_prev, read_curr));
        let room = (rpu - read_next - unsent).max(0.0);
        let offset =
            (self.synced_at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64 / (1u64 << 53) as f64;
        (float(after) - read - offset) * of > own * room
    }

    /// Whether a settled node should re-read this entity before its next tick, in a burst
    /// read (`global/sync/shard.rs`; due in `tier.rs`): the others add [`SETTLED_FAST`] of the
    /// limit or more in a tick, the last reply left room, and this node's hits since are
    /// [`SETTLED_READ_AT`] of its share of that room or more (none in flight). Each node of
    /// a fleet running into its limit that way sends its hits and re-reads the count as it
    /// spends, so a share is taken on a read that misses little of the others' hits, rather
    /// than up to a tick of them. Two replicas at 400 a second on a limit of 600 an hour
    /// admitted up to 1.25× without (30 seeds): one settled on a read that held a second-old
    /// part of the other's.
    pub fn read_due(&self, limit: &Limit, now: UnixMillis, tick_ms: u64) -> bool {
        if self.synced_at == 0 || self.slots.iter().any(|s| s.inflight != 0) {
            return false;
        }
        let rpu = f64::from(limit.requests_per_unit);
        let rate = f64::from(self.others_per_sec);
        if rate * float(tick_ms) * 1e-3 < SETTLED_FAST * rpu {
            return false;
        }
        let epoch = self.epoch_at(limit, now);
        let span = Span::new(limit, now, epoch);
        let (read_prev, read_curr) = self.pair(epoch, |_, s| s.remote);
        let read = float(span.count(read_prev, read_curr));
        let unsent = UNSENT_RESERVED * rate * f64::from(self.gap_ms / 2) * 1e-3;
        let room = rpu - read - unsent;
        if room < 1.0 {
            return false;
        }
        let share = match self.share_parts(epoch, (read_prev, read_curr), span.weight()) {
            Some((own, of)) => (own / of).clamp(SHARE_FLOOR, 1.0),
            None => return false,
        };
        let since = |_: usize, s: &Slot| (s.inflight + s.pending).max(0) as u64;
        let (p, c) = self.pair(epoch, since);
        let own = float(span.count(p, c));
        own >= 1.0 && own >= SETTLED_READ_AT * share * room
    }

    /// This node's share of the window's count as of the last reply: own acknowledged hits
    /// over the fleet's count, both weighted as the window weighs them. Own hits not yet
    /// acknowledged are left out on both sides, or a node cut off from Redis would see its
    /// share creep up to 1 as the fleet's last count drained out of the window. 1 before any
    /// reply (local mode); `unknown` when the count read is 0.
    pub(super) fn share(&self, limit: &Limit, now: UnixMillis, epoch: u64, unknown: f64) -> f64 {
        let remote = self.pair(epoch, |_, s| s.remote);
        let weight = Span::new(limit, now, epoch).weight();
        match self.share_parts(epoch, remote, weight) {
            Some((own, read)) => (own / read).clamp(SHARE_FLOOR, 1.0),
            None => unknown,
        }
    }

    /// The two sides of [`WindowState::share`] on the counts read of `epoch - 1` and `epoch`,
    /// the previous one weighing `weight` ([`weight`]): own acknowledged hits and the fleet's
    /// count, weighted; `None` when the count read is 0, or when this node gave back more
    /// than it counted there.
    ///
    /// Why not a share of nothing then: a node's part goes below zero when it gives back hits
    /// another node counted (a release or a settle through another replica, or one retried
    /// through two, the store applying it only once). Its part then says nothing of its
    /// traffic, and a share measured on it would be the floor until its own hits paid the
    /// debt back, which at the floor they almost never do: on two nodes that each released
    /// twice what they held, 5 of the 10 places were admitted (`window/tests.rs`). It takes
    /// its prior share, as a node that read nothing does.
    fn share_parts(
        &self,
        epoch: u64,
        (read_prev, read_curr): (u64, u64),
        weight: f64,
    ) -> Option<(f64, f64)> {
        // In floats: near the end of a window the weighted counts are small, and rounding
        // them would make the share jump.
        let acked = |i: usize, s: &Slot| i64::from(self.own[i]) - s.inflight - s.pending;
        let (own_prev, own_curr) = self.pair(epoch, acked);
        let own = own_prev as f64 * weight + own_curr as f64;
        let read = float(read_prev) * weight + float(read_curr);
        (read > 0.0 && own >= 0.0).then_some((own, read))
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
        let share = self.share(limit, now, epoch, 1.0);
        let fleet = (self.others_per_sec() + own).max(own / share);
        let ahead = fleet * ahead_ms as f64 / 1000.0;
        (self.estimate(limit, now) as f64 + ahead) / f64::from(limit.requests_per_unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::*;

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
    fn each_node_spends_only_its_share_of_the_room_left() {
        let l = sliding(1000);
        let mut store = std::collections::HashMap::new();
        let (mut a, mut b) = (WindowState::default(), WindowState::default());
        let t = T0.plus_millis(10_000);
        // B counted 90 and synced; then A counted 10 and synced: A has 10 % of the count.
        hit(&mut b, &l, t, 90);
        sync(&mut b, &l, &mut store, t);
        hit(&mut a, &l, t, 10);
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
        hit(&mut s, &l, late, 100);
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
    fn a_settled_node_in_a_surge_re_reads_as_it_spends_its_share() {
        let l = fixed(2_000);
        let (t1, t2) = (T0.plus_millis(10_000), T0.plus_millis(11_000));
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        // 100 own and 100 others', then a second later 100 more own and 200 more others':
        // 200 a second, a tenth of the limit in a tick.
        hit(&mut s, &l, t1, 100);
        *store.entry(T0.0 / MIN).or_default() += 100;
        sync(&mut s, &l, &mut store, t1);
        hit(&mut s, &l, t2, 100);
        *store.entry(T0.0 / MIN).or_default() += 200;
        sync(&mut s, &l, &mut store, t2);
        assert_eq!(s.others_per_sec(), 200.0);
        // Room: 2000 - 500 read - 0.75 × 200 × 0.5 s unsent = 1425; its share 200 / 500 of
        // it is 570, an eighth of that 71.25.
        hit(&mut s, &l, t2.plus_millis(1), 71);
        assert!(!s.read_due(&l, t2.plus_millis(1), 1_000));
        hit(&mut s, &l, t2.plus_millis(2), 1);
        assert!(s.read_due(&l, t2.plus_millis(2), 1_000));
        // Others adding less than 5 % of the limit in a tick (the window's drain at the
        // limit): the tick's read is enough.
        assert!(!s.read_due(&l, t2.plus_millis(2), 400));
        // In flight: the reply will tell.
        let plan = s.begin_sync(&l, t2.plus_millis(2));
        assert!(!s.read_due(&l, t2.plus_millis(2), 1_000));
        s.fail_sync(&plan);
    }

    /// The share decision as it was written before it lost its division: the room this
    /// node leaves to the others, `ceil(limit − read − share × room − offset)`, added to the
    /// count it knows. An oracle for [`WindowState::over_room_share`] and its shortcut far
    /// from the limit.
    fn over_by_reserve(
        s: &WindowState,
        l: &Limit,
        now: UnixMillis,
        hits: u64,
        f: &FleetView,
    ) -> bool {
        let epoch = s.epoch_at(l, now);
        let (prev, curr) = s.pair(epoch, |_, x| x.total());
        let known = WindowState::window(l, now, epoch, prev, curr);
        let rpu = u64::from(l.requests_per_unit);
        let share = s.share(l, now, epoch, f.prior_share());
        let reserve = if s.young(f) || share >= 1.0 {
            0
        } else {
            let (rp, rc) = s.pair(epoch, |_, x| x.remote);
            let read = WindowState::window(l, now, epoch, rp, rc) as f64;
            let end = (epoch + 1) * l.window_ms - 1;
            let next = UnixMillis(now.0.max(s.synced_at + u64::from(s.gap_ms)).min(end));
            let read_next = WindowState::window(l, next, epoch, rp, rc) as f64;
            let rate = f64::from(s.others_per_sec) * f.rate_factor(s.synced_at);
            let unsent = UNSENT_RESERVED * rate * f64::from(s.gap_ms / 2) / 1000.0;
            let room = (f64::from(l.requests_per_unit) - read_next - unsent).max(0.0);
            let offset = (s.synced_at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64
                / (1u64 << 53) as f64;
            (f64::from(l.requests_per_unit) - read - share * room - offset)
                .max(0.0)
                .ceil() as u64
        };
        known + reserve + hits > rpu
    }

    proptest::proptest! {
        /// A settled node's verdict is the reserve formula's, on counts near the limit (the
        /// exact comparison) and far from it (the shortcut), sliding and fixed, alone or in
        /// fleets up to past the share's floor.
        #[test]
        fn the_share_decision_is_the_reserve_formula(
            rpu in 1u32..100_000,
            sliding_window in proptest::bool::ANY,
            // The counts, in thousandths of a quarter of the limit each (a tenth for the
            // pending hits): a window from empty to about full.
            parts in proptest::array::uniform5(0u64..1_000),
            hits in 0u64..4,
            live in 1u32..80,
            at in 0u64..58_000,
        ) {
            let of_limit = |n: u64, d: u64| u64::from(rpu) * n / d;
            let q = parts.map(|n| of_limit(n, 4_000));
            let (own, others, more, others_more) = (q[0], q[1], q[2], q[3]);
            let pending = of_limit(parts[4], 10_000);
            let l = if sliding_window { sliding(rpu) } else { fixed(rpu) };
            let f = FleetView { live, tick_ms: 1, ..FleetView::ALONE };
            let (t1, t2) = (T0.plus_millis(MIN + 500), T0.plus_millis(MIN + 1_500));
            let mut s = WindowState::default();
            let mut counted = 0;
            for (t, mine, theirs) in [(t1, own, others), (t2, more, others_more)] {
                s.record(&l, t, mine);
                let plan = s.begin_sync(&l, t);
                counted += mine + theirs;
                s.complete_sync(&l, &plan, [counted, 0], t.plus_millis(1));
            }
            let now = t2.plus_millis(2 + at);
            s.record(&l, now, pending);
            // The reserve formula is monotonic in the hits asked for: the first number of hits
            // it refuses is the boundary, and both sides of it must agree.
            let (mut lo, mut hi) = (0, u64::from(rpu) + 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if over_by_reserve(&s, &l, now, mid, &f) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            for h in [lo.saturating_sub(1), lo, hits] {
                proptest::prop_assert_eq!(
                    s.check_with(&l, now, h, &f).over,
                    over_by_reserve(&s, &l, now, h, &f),
                    "{} hits",
                    h
                );
            }
        }
    }
}
