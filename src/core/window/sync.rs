//! Global mode's accounting of a window state's own hits: pending → in flight →
//! acknowledged ([`SyncPlan`], [`Part`]), and the others' rate measured from each reply.
//!
//! A sync is idempotent, and a store that restarts empty is rebuilt: each node's part of a
//! counter is its own (Redis keeps one per replica), and every sync states that part whole —
//! the node's hits and refunds in the epoch so far ([`SyncPlan::parts`]), never a delta. Both
//! only grow, so the store keeps the larger of what it holds and what a call says: a call
//! that timed out but ran and was then sent again, a late duplicate or calls applied out of
//! order count each hit once, and after a restart the count comes back to the sum of what
//! the live nodes counted as each syncs the entity again.

use super::{Limit, WindowState, MAX_COUNT};
use crate::core::clock::UnixMillis;
use crate::core::fleet_view::MIN_SAMPLE_MS;

/// What one sync sends and reads for one limit: this node's part of the current and previous
/// epoch's counters, stated whole, and the hits it adds to each (to settle them on the reply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// The current and the previous epoch.
    pub epochs: [u64; 2],
    /// Own hits this sync moves from pending to in flight, per epoch (0: nothing new).
    pub deltas: [i64; 2],
    /// This node's part of each epoch's counter: every hit and every refund it has counted
    /// there so far, sent or not. Both only ever grow, so the store keeps the larger of what
    /// it holds and what a call states, never adds: a call that timed out and ran all the
    /// same, then was sent again, a late duplicate, calls applied out of order, and a store
    /// that restarted empty all leave the part at exactly what this node counted.
    pub parts: [Part; 2],
    /// The fleet's count of each epoch as this node last read it: the store answers no less
    /// than this less the refunds it applied (`floor − refunds`), so a store that restarted
    /// empty does not read as room while the others restate their parts, yet a refund made
    /// through any replica shows at this node's next read.
    pub floors: [u64; 2],
    /// A burst read (`prior.rs`): a reply this soon after the last one measures the others'
    /// rate all the same.
    pub burst: bool,
}

/// One node's part of one counter, as a sync states it: its hits and its refunds so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Part {
    /// Hits counted (admitted or not, as the limit counts them).
    pub hits: u64,
    /// Hits given back (Envoy's `is_negative_hits`).
    pub refunds: u64,
}

/// The shortest span a rate sample stands for alone; a shorter one is blended with the rate
/// before (weighing what it covers of this span). The others sync once a tick, so a read a
/// few hundred milliseconds after the last one holds a whole sync of theirs or none: a
/// young replica's sends measured 633 or 34 a second of a steady 200, and the reserve for
/// their unsent hits followed.
const RATE_SPAN_MS: u64 = 1000;

// === impl WindowState ===

impl WindowState {
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
    /// in-flight, and the plan states this node's whole part of both counters
    /// ([`SyncPlan::parts`]), which the store keeps if it holds less.
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
            ..SyncPlan::default()
        };
        for i in 0..2 {
            let slot = (plan.epochs[i] % 2) as usize;
            let s = &mut self.slots[slot];
            if s.epoch == plan.epochs[i] && (i == 0 || epoch > 0) {
                // Whole, a sync still in flight included: a part stated whole covers every
                // earlier statement, whichever of them the store applies last.
                let refunds = self.refunded[slot];
                plan.parts[i] = Part {
                    hits: (i64::from(self.own[slot]) + i64::from(refunds)).max(0) as u64,
                    refunds: u64::from(refunds),
                };
                plan.floors[i] = s.remote;
                plan.deltas[i] = s.pending;
                s.inflight += s.pending;
                s.pending = 0;
            }
        }
        plan
    }

    /// Completes a sync: `totals` are the fleet's counters of `plan.epochs` after the deltas
    /// were added, read at `now`, never below the plan's floors less the refunds the store
    /// applied ([`SyncPlan::floors`]). Measures the other nodes' rate from what they added
    /// since the previous reply.
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
            // The store's count as it is, lower after refunds (the floor kept it from
            // dropping for a store that lost its counters). A burst read's reply may be older
            // than one settled before it (two calls under way, applied in either order): it
            // only raises the count. Capped as every count is, so a slot's sum stays far
            // inside i64 (`Slot::total`).
            let total = total.min(MAX_COUNT);
            s.remote = if plan.burst {
                s.remote.max(total)
            } else {
                total
            };
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
            if whole && (span_ms >= MIN_SAMPLE_MS || (plan.burst && span_ms >= 1)) {
                self.measure(others, span_ms, now, plan.burst);
            }
        }
        self.grow_older(now);
        self.synced_at = now.0.max(1);
    }

    /// Takes a rate sample: the others added `others` over the last `span_ms`, as read at
    /// `now`. A burst read's reply (`prior.rs`) only sets the gap: a few milliseconds hold a
    /// few of the others' syncs, or none, and say little of their rate.
    fn measure(&mut self, others: i64, span_ms: u64, now: UnixMillis, burst: bool) {
        let gap = now
            .0
            .saturating_sub(self.synced_at)
            .clamp(1, u64::from(u16::MAX)) as u16;
        let added = others.max(0) as f32 * 1000.0;
        if burst && span_ms < MIN_SAMPLE_MS {
            // A few milliseconds hold a few of the others' syncs, or none: burst reads
            // average over the time since the first reply, the burst so far.
            let covered = f32::from(self.age_ms);
            self.others_per_sec =
                (self.others_per_sec * covered + added) / (covered + span_ms as f32);
            self.gap_ms = gap;
            return;
        }
        // The last interval's rate, not an average: it sizes hits of the last moments, and a
        // fleet reaching its limit slows down within one interval. But an interval shorter
        // than [`RATE_SPAN_MS`] holds the others' syncs in lumps: blended with the rate before.
        let span = span_ms as f32;
        let horizon = RATE_SPAN_MS as f32;
        self.others_per_sec = if self.gap_ms == 0 || span >= horizon {
            added / span
        } else {
            (self.others_per_sec * (horizon - span) + added) / horizon
        };
        // Near the limit every node syncs every tick, and that is when the others' unsent
        // hits matter: follow a shorter gap at once, a longer one slowly (and at once after
        // burst reads, whose gap says nothing of the tick's).
        let after_burst = u64::from(self.gap_ms) < MIN_SAMPLE_MS;
        self.gap_ms = if self.gap_ms == 0 || gap <= self.gap_ms || after_burst {
            gap
        } else {
            self.gap_ms + (gap - self.gap_ms) / 8
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::*;

    #[test]
    fn hits_during_a_sync_in_flight_are_counted_once() {
        let l = fixed(10);
        let mut s = WindowState::default();
        let mut store = std::collections::HashMap::new();
        for _ in 0..3 {
            hit(&mut s, &l, T0, 1);
        }
        let plan = s.begin_sync(&l, T0);
        assert_eq!(plan.deltas, [3, 0]);
        // Two more hits while the sync is in flight.
        hit(&mut s, &l, T0.plus_millis(10), 1);
        hit(&mut s, &l, T0.plus_millis(10), 1);
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
    fn a_sync_that_ran_but_timed_out_is_never_counted_twice() {
        // Redis slower than the timeout: the call is given up (fail_sync) but runs all the
        // same, and its hits go again with the next call; a later call's statement reaches the
        // store before an older one's; a refund in between.
        let l = fixed(1_000);
        let mut store = PartStore::new();
        let mut a = WindowState::default();
        let t = T0.plus_millis(1_000);
        a.record(&l, t, 70);
        let first = a.begin_sync(&l, t);
        apply_as(&mut store, 1, &first); // it ran...
        a.fail_sync(&first); // ...but no reply came in time
        a.record(&l, t, 5);
        a.refund(&l, t, 2);
        let second = a.begin_sync(&l, t);
        assert_eq!(second.deltas[0], 73);
        let totals = apply_as(&mut store, 1, &second);
        apply_as(&mut store, 1, &first); // a duplicate of the first, late
        a.complete_sync(&l, &second, totals, t);
        assert_eq!((totals[0], part(&store, T0.0 / MIN)), (73, 73));
        assert_eq!(a.check(&l, t, 0).count_after, 73);
        // Another replica's part is its own.
        let mut b = WindowState::default();
        b.record(&l, t, 10);
        let plan = b.begin_sync(&l, t);
        apply_as(&mut store, 2, &plan);
        apply_as(&mut store, 2, &plan);
        assert_eq!(part(&store, T0.0 / MIN), 83);
    }

    #[test]
    fn a_store_that_restarts_empty_gets_each_nodes_acknowledged_part_back() {
        let l = sliding(300);
        let mut store = std::collections::HashMap::new();
        let (mut a, mut b) = (WindowState::default(), WindowState::default());
        // A counted 100 and B 120 late in a window, all acknowledged.
        let late = T0.plus_millis(MIN - 2_000);
        hit(&mut a, &l, late, 100);
        hit(&mut b, &l, late, 120);
        for t in [late, late.plus_millis(1_000)] {
            sync_as(&mut a, 1, &l, &mut store, t);
            sync_as(&mut b, 2, &l, &mut store, t);
        }
        assert_eq!(part(&store, T0.0 / MIN), 220);
        // The store restarts empty early in the next window; A counts one more hit there.
        store.clear();
        let next = T0.plus_millis(MIN + 1_000);
        a.record(&l, next, 1);
        let plan = a.begin_sync(&l, next);
        let said = |hits| Part { hits, refunds: 0 };
        assert_eq!((plan.deltas, plan.parts), ([1, 0], [said(1), said(100)]));
        let totals = apply_as(&mut store, 1, &plan);
        a.complete_sync(&l, &plan, totals, next);
        // A's part of the previous epoch is back at once; B's with B's next sync, a read.
        // Meanwhile the store answers what A last read of that epoch (its floor), not 100.
        assert_eq!(totals, [1, 220]);
        sync_as(&mut b, 2, &l, &mut store, next);
        assert_eq!(
            (part(&store, T0.0 / MIN), part(&store, T0.0 / MIN + 1)),
            (220, 1)
        );
        // Not the 120 that topping up a single counter to each node's own count would give.
        sync_as(&mut a, 1, &l, &mut store, next.plus_millis(1_000));
        let at = next.plus_millis(1_000);
        assert_eq!(
            a.check(&l, at, 0).count_after,
            220 * (MIN - 2_000) / MIN + 1
        );
    }

    #[test]
    fn a_part_is_kept_at_the_larger_of_held_and_stated() {
        let l = fixed(100);
        let mut store = std::collections::HashMap::new();
        let (mut a, mut b) = (WindowState::default(), WindowState::default());
        hit(&mut a, &l, T0, 10);
        sync_as(&mut a, 1, &l, &mut store, T0);
        // B counts 5, then gives back 10 hits, its own and A's (Envoy's negative hits,
        // balanced to another replica): B's part goes below zero, and its syncs keep it there.
        hit(&mut b, &l, T0, 5);
        sync_as(&mut b, 2, &l, &mut store, T0);
        b.refund(&l, T0, 10);
        for t in [T0, T0.plus_millis(1_000), T0.plus_millis(2_000)] {
            sync_as(&mut b, 2, &l, &mut store, t);
        }
        let b_part = store[&(T0.0 / MIN, 2)];
        assert_eq!(
            (b_part.hits, b_part.refunds, part(&store, T0.0 / MIN)),
            (5, 10, 5)
        );
        // A part holding more than the node states is left as it is.
        store.get_mut(&(T0.0 / MIN, 1)).unwrap().hits += 3;
        sync_as(&mut a, 1, &l, &mut store, T0.plus_millis(3_000));
        assert_eq!(store[&(T0.0 / MIN, 1)].hits, 13);
    }

    #[test]
    fn a_refund_through_another_replica_shows_on_the_next_read() {
        // A charges 100 of 100 (a reservation); B reads the key over. A gives 40 back (the
        // settle): B's next read shows 60 and B admits again. (B kept the largest count it had
        // read, and denied until the window ended.)
        let l = fixed(100);
        let mut store = PartStore::new();
        let (mut a, mut b) = (WindowState::default(), WindowState::default());
        hit(&mut a, &l, T0, 100);
        sync_as(&mut a, 1, &l, &mut store, T0);
        sync_as(&mut b, 2, &l, &mut store, T0);
        assert!(b.check(&l, T0, 1).over);
        a.refund(&l, T0, 40);
        let t = T0.plus_millis(1_000);
        sync_as(&mut a, 1, &l, &mut store, t);
        sync_as(&mut b, 2, &l, &mut store, t);
        let v = b.check(&l, t, 0);
        assert_eq!((v.count_after, v.remaining), (60, 40));
        // The store restarts empty: B's next read keeps what it last read, less the refunds
        // restated since (none yet), not the empty store's room.
        store.clear();
        let t = T0.plus_millis(2_000);
        sync_as(&mut b, 2, &l, &mut store, t);
        assert_eq!(b.check(&l, t, 0).count_after, 60);
        // A restates its part (100 hits, 40 refunds): the count is whole again.
        sync_as(&mut a, 1, &l, &mut store, t);
        sync_as(&mut b, 2, &l, &mut store, t.plus_millis(1_000));
        assert_eq!(
            (part(&store, T0.0 / MIN), b.check(&l, t, 0).count_after),
            (60, 60)
        );
    }

    #[test]
    fn a_failed_sync_is_resent() {
        let l = fixed(10);
        let mut s = WindowState::default();
        hit(&mut s, &l, T0, 4);
        let plan = s.begin_sync(&l, T0);
        s.fail_sync(&plan);
        assert_eq!((s.pending(), s.check(&l, T0, 0).count_after), (4, 4));
        assert_eq!(s.begin_sync(&l, T0).deltas, [4, 0]);
    }

    #[test]
    fn a_reply_after_the_window_moved_settles_the_previous_epoch() {
        let l = sliding(100);
        let mut s = WindowState::default();
        let mut store = std::collections::HashMap::new();
        let late = T0.plus_millis(MIN - 5);
        hit(&mut s, &l, late, 10);
        let plan = s.begin_sync(&l, late);
        // The reply arrives in the next window, after more hits there.
        let next = T0.plus_millis(MIN);
        hit(&mut s, &l, next, 1);
        let totals = apply(&mut store, &plan);
        s.complete_sync(&l, &plan, totals, next);
        // prev = 10 (acknowledged, weighted ~1), curr = 1 pending: nothing lost or doubled.
        assert_eq!(s.check(&l, next, 0).count_after, 10 + 1);
        assert_eq!(s.begin_sync(&l, next).deltas, [1, 0]);
    }

    #[test]
    fn the_others_rate_is_measured_between_replies_across_a_boundary() {
        let l = sliding(1000);
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        let t1 = T0.plus_millis(MIN - 500);
        hit(&mut s, &l, t1, 1);
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
    fn a_rate_sample_shorter_than_a_second_is_blended_with_the_rate_before() {
        let l = fixed(100_000);
        let t = T0.plus_millis(10_000);
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        sync(&mut s, &l, &mut store, t);
        *store.entry(T0.0 / MIN).or_default() += 200;
        sync(&mut s, &l, &mut store, t.plus_millis(1_000));
        assert_eq!(s.others_per_sec(), 200.0);
        // A whole sync of the others' lands in the next 200 ms: 500 a second alone, a fifth
        // of a second's worth blended with the 200 before.
        *store.entry(T0.0 / MIN).or_default() += 100;
        sync(&mut s, &l, &mut store, t.plus_millis(1_200));
        assert_eq!(s.others_per_sec(), 260.0);
        // A second or more stands alone.
        *store.entry(T0.0 / MIN).or_default() += 100;
        sync(&mut s, &l, &mut store, t.plus_millis(2_200));
        assert_eq!(s.others_per_sec(), 100.0);
    }
}
