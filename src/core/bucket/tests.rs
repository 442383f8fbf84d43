//! Tests of `bucket.rs`: the bucket on a manual clock, against a model, and its sync.

use super::*;
use crate::core::fixtures::{hit, hit_lenient, T0};
use crate::core::limit::Algorithm;
use proptest::prelude::*;

/// `rate` tokens a second, bursts of `burst`.
fn bucket(rate: u32, burst: u32) -> Limit {
    Limit {
        requests_per_unit: rate,
        window_ms: 1000,
        algorithm: Algorithm::TokenBucket { burst },
    }
}

/// Single-token requests at `t` until one is denied (lenient); how many were admitted.
fn drain(b: &mut BucketState, l: &Limit, t: UnixMillis) -> u64 {
    (0..100_000)
        .take_while(|_| !hit_lenient(b, l, t, 1).over)
        .count() as u64
}

#[test]
fn a_new_bucket_is_full_and_a_burst_takes_it_all() {
    let l = bucket(10, 30);
    let mut b = BucketState::default();
    let v = b.check_with(&l, T0, 0, &FleetView::ALONE);
    assert_eq!((v.over, v.remaining, v.reset_ms), (false, 30, 0));
    assert_eq!(drain(&mut b, &l, T0), 30);
    let v = b.check_with(&l, T0, 1, &FleetView::ALONE);
    // Empty: the 31st waits a tenth of a second; full again in 3 s.
    assert_eq!(
        (v.over, v.remaining, v.retry_ms, v.reset_ms),
        (true, 0, 100, 3000)
    );
}

#[test]
fn tokens_come_back_at_the_refill_rate() {
    let l = bucket(10, 30);
    let mut b = BucketState::default();
    drain(&mut b, &l, T0);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(99)), 0);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(100)), 1);
    // A second later, ten more; after a long pause, no more than the burst.
    assert_eq!(drain(&mut b, &l, T0.plus_millis(1_100)), 10);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(100_000)), 30);
}

#[test]
fn a_request_is_admitted_whole_or_not_at_all() {
    let l = bucket(10, 30);
    let mut b = BucketState::default();
    assert!(!hit_lenient(&mut b, &l, T0, 25).over);
    let v = hit_lenient(&mut b, &l, T0, 6);
    assert!(v.over);
    // None of the 6 was taken: 5 still fit, and 6 would fit 0.1 s later.
    assert_eq!(v.retry_ms, 100);
    assert_eq!(b.check_with(&l, T0, 5, &FleetView::ALONE).remaining, 0);
    assert!(!hit_lenient(&mut b, &l, T0, 5).over);
    // More than the burst never fits; it is told the time until the bucket is full.
    let v = b.check_with(&l, T0, 31, &FleetView::ALONE);
    assert_eq!((v.over, v.retry_ms), (true, 3000));
}

#[test]
fn strict_charges_denied_requests_down_to_one_capacity_below_empty() {
    let l = bucket(10, 30);
    let (mut strict, mut lenient) = (BucketState::default(), BucketState::default());
    for _ in 0..100 {
        hit(&mut strict, &l, T0, 1);
        hit_lenient(&mut lenient, &l, T0, 1);
    }
    // A second later the lenient bucket has 10 tokens; the strict one is still 20 short
    // (it owed 60, capped at two capacities).
    let t = T0.plus_millis(1_000);
    assert_eq!(lenient.owed(&l, t), 20);
    assert_eq!(strict.owed(&l, t), 50);
    assert!(hit(&mut strict, &l, t, 1).over);
    assert!(!hit_lenient(&mut lenient, &l, t, 1).over);
    // A strict client that stops gets its whole burst back once its debt is repaid.
    assert_eq!(drain(&mut strict, &l, t.plus_millis(5_100)), 30);
}

#[test]
fn a_refund_gives_tokens_back_never_past_full() {
    let l = bucket(10, 30);
    let mut b = BucketState::default();
    hit_lenient(&mut b, &l, T0, 20);
    b.refund_with(&l, T0, 5, &FleetView::ALONE);
    assert_eq!(b.owed(&l, T0), 15);
    b.refund_with(&l, T0, u64::MAX, &FleetView::ALONE);
    assert_eq!(b.owed(&l, T0), 0);
    assert_eq!(drain(&mut b, &l, T0), 30);
}

#[test]
fn zero_rate_or_burst_always_denies_and_a_huge_addend_saturates() {
    let mut b = BucketState::default();
    assert!(hit_lenient(&mut b, &bucket(0, 10), T0, 1).over);
    assert!(hit_lenient(&mut b, &bucket(10, 0), T0, 1).over);
    let l = bucket(10, 30);
    let mut b = BucketState::default();
    assert!(hit(&mut b, &l, T0, u64::MAX).over);
    assert_eq!(b.owed(&l, T0), 60, "debt stops at one capacity below empty");
}

#[test]
fn a_slow_bucket_keeps_exact_time() {
    // 3 an hour, burst 1: the interval is 20 minutes to the nanosecond.
    let l = Limit {
        requests_per_unit: 3,
        window_ms: 3_600_000,
        algorithm: Algorithm::TokenBucket { burst: 1 },
    };
    assert_eq!(Geometry::of(&l).interval_ns, 1_200_000_000_000);
    let mut b = BucketState::default();
    assert_eq!(drain(&mut b, &l, T0), 1);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(1_199_999)), 0);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(1_200_000)), 1);
}

/// A model bucket in tokens as fractions: level, refilled continuously, capped at burst.
#[derive(Debug)]
struct Model {
    level: f64,
    at_ms: u64,
}

impl Model {
    /// Whether `hits` at `now_ms` are over; `forced` decides instead (a knife edge).
    fn over(
        &mut self,
        l: (u32, u32),
        now_ms: u64,
        hits: u64,
        strict: bool,
        forced: Option<bool>,
    ) -> bool {
        let (rate, burst) = l;
        let refill = (now_ms - self.at_ms) as f64 * f64::from(rate) / 1000.0;
        self.level = (self.level + refill).min(f64::from(burst));
        self.at_ms = now_ms;
        let fits = forced.map_or(rate > 0 && hits as f64 <= self.level + 1e-9, |over| !over);
        if fits || strict {
            self.level = (self.level - hits as f64).max(-f64::from(burst));
        }
        !fits
    }
}

proptest! {
    #[test]
    fn decisions_match_a_model_bucket(
        rate in 1u32..200,
        burst in 1u32..100,
        strict in any::<bool>(),
        steps in proptest::collection::vec((0u64..400, 0u64..12), 1..200),
    ) {
        let l = bucket(rate, burst);
        let mut b = BucketState::default();
        let mut m = Model { level: f64::from(burst), at_ms: T0.0 };
        let mut now = T0.0;
        for (gap, hits) in steps {
            now += gap;
            let t = UnixMillis(now);
            let v = if strict { hit(&mut b, &l, t, hits) } else { hit_lenient(&mut b, &l, t, hits) };
            // The model's level in floats, sluice's interval rounded to whole nanoseconds:
            // skip the knife edges where rounding decides.
            let before = m.level + (now - m.at_ms) as f64 * f64::from(rate) / 1000.0;
            let edge = (before.min(f64::from(burst)) - hits as f64).abs() < 1e-4;
            // At an edge the model follows sluice's decision, so the two stay in step.
            let want = m.over((rate, burst), now, hits, strict, edge.then_some(v.over));
            prop_assert_eq!(v.over, want, "at {} ms, {} hits", now - T0.0, hits);
            if !v.over {
                prop_assert!(u64::from(v.remaining) <= u64::from(burst));
            }
        }
    }
}

/// A fake fleet bucket: the store's semantics (`SyncOp::Bucket`) on one `(tat µs, spent)`.
fn apply(store: &mut (f64, u64), l: &Limit, plan: &BucketPlan, now: UnixMillis) -> [u64; 2] {
    let g = Geometry::of(l);
    let now_us = (now.0 * 1000) as f64;
    if plan.spend != 0 {
        let t = g.interval_ns as f64 / 1000.0;
        store.0 = (store.0.max((plan.since_ms * 1000) as f64) + plan.spend as f64 * t)
            .max(now_us)
            .min((now_us + g.max_ahead_ns as f64 / 1000.0).max(store.0));
    }
    if plan.delta != 0 {
        store.1 = (store.1 as i64 + plan.delta).max(0) as u64;
    }
    [store.0 as u64, store.1]
}

fn sync(b: &mut BucketState, l: &Limit, store: &mut (f64, u64), now: UnixMillis) {
    let plan = b.begin_sync();
    let totals = apply(store, l, &plan, now);
    b.complete_sync(l, &plan, totals, now);
}

#[test]
fn one_node_syncing_stays_exact() {
    let l = bucket(10, 30);
    let mut store = (0.0, 0);
    let mut b = BucketState::default();
    assert_eq!(drain(&mut b, &l, T0), 30);
    sync(&mut b, &l, &mut store, T0.plus_millis(5));
    assert_eq!(store.1, 30);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(5)), 0);
    assert_eq!(drain(&mut b, &l, T0.plus_millis(1_000)), 10);
    sync(&mut b, &l, &mut store, T0.plus_millis(1_000));
    assert_eq!(b.pending(), 0);
    assert_eq!(b.owed(&l, T0.plus_millis(1_000)), 30);
}

#[test]
fn another_nodes_spends_reach_this_node_through_the_store() {
    let l = bucket(10, 30);
    let mut store = (0.0, 0);
    let (mut a, mut b) = (BucketState::default(), BucketState::default());
    assert_eq!(drain(&mut a, &l, T0), 30);
    sync(&mut a, &l, &mut store, T0);
    sync(&mut b, &l, &mut store, T0.plus_millis(1));
    // B sees the bucket A emptied.
    assert_eq!(drain(&mut b, &l, T0.plus_millis(1)), 0);
    assert!(
        b.check_with(&l, T0.plus_millis(500), 1, &FleetView::ALONE)
            .remaining
            <= 5
    );
}

#[test]
fn a_failed_sync_is_resent_and_a_lost_bucket_is_restored() {
    let l = bucket(10, 30);
    let mut store = (0.0, 0);
    let mut b = BucketState::default();
    hit_lenient(&mut b, &l, T0, 20);
    let plan = b.begin_sync();
    b.fail_sync(&plan);
    assert_eq!(b.pending(), 20);
    sync(&mut b, &l, &mut store, T0);
    assert_eq!(store.1, 20);
    // The store loses the bucket; the next plan carries what this node read, as its floor.
    let plan = b.begin_sync();
    assert_eq!(plan.floor_us, (T0.0 + 2_000) * 1000);
}

fn fleet(live: u32) -> FleetView {
    FleetView {
        live,
        ..FleetView::ALONE
    }
}

/// Single-token requests at `t` with `f` until one is denied (lenient); how many admitted.
fn drain_in(b: &mut BucketState, l: &Limit, t: UnixMillis, f: &FleetView) -> u64 {
    (0..100_000)
        .take_while(|_| {
            let v = b.check_with(l, t, 1, f);
            if !v.over {
                b.record_with(l, t, 1, f);
            }
            !v.over
        })
        .count() as u64
}

/// A node of four, settled, whose share is measured at a quarter: it syncs at 0 and 1 s
/// while the others spend as much as it does.
fn settled_quarter(l: &Limit, store: &mut (f64, u64)) -> BucketState {
    let f = fleet(4);
    let mut b = BucketState::default();
    for s in 0..=2u64 {
        let t = T0.plus_millis(s * 1000);
        b.record_with(l, t, 1, &f);
        store.1 += 3; // the others' spends, which refill long before the next read
        sync(&mut b, l, store, t);
    }
    assert!(b.settled(f.tick_ms));
    b
}

#[test]
fn a_settled_node_spends_its_share_of_the_room_and_the_refill_since_its_read() {
    let l = bucket(100, 200);
    let f = fleet(4);
    let mut store = (0.0, 0);
    let mut b = settled_quarter(&l, &mut store);
    let t = T0.plus_millis(2_000);
    // A full bucket: a quarter of 200 (less the others' unsent spends), with 3 deviations
    // of a binomial share, sqrt(50) each: about 71 in all.
    let first = drain_in(&mut b, &l, t, &f);
    assert!((68..=72).contains(&first), "{first}");
    // Half a second on, a quarter of the 50 tokens the refill brought is this node's.
    let more = drain_in(&mut b, &l, t.plus_millis(500), &f);
    assert!((12..=15).contains(&more), "{more}");
}

#[test]
fn spends_before_the_bucket_was_seen_full_are_counted_not_spent_again() {
    let l = bucket(100, 200);
    let f = fleet(4);
    let mut store = (0.0, 0);
    let mut b = settled_quarter(&l, &mut store);
    // The fleet spends 4 a second of a refill of 100: one token now, and half a second on
    // the bucket is full again in this node's view and at the others' measured rate.
    let t = T0.plus_millis(2_100);
    b.record_with(&l, t, 1, &f);
    b.record_with(&l, t.plus_millis(500), 1, &f);
    b.record_with(&l, t.plus_millis(505), 1, &f);
    let plan = b.begin_sync();
    assert_eq!((plan.delta, plan.spend), (3, 2));
    assert_eq!(plan.since_ms, t.plus_millis(500).0);
    // The store counts all three and spends the last two from the first of them: a flood's
    // spends synced first are not followed by a token refilled long before it.
    let now = t.plus_millis(510);
    let [tat_us, spent] = apply(&mut store, &l, &plan, now);
    assert_eq!(tat_us, (t.plus_millis(500).0 + 20) * 1000);
    assert_eq!(spent, 12 + 3);
    b.complete_sync(&l, &plan, [tat_us, spent], now);
    assert_eq!(b.pending(), 0);
}

#[test]
fn after_a_pause_the_share_is_of_a_full_bucket_whatever_was_read() {
    let l = bucket(5, 30);
    let f = fleet(4);
    let mut store = (0.0, 0);
    let mut b = settled_quarter(&l, &mut store);
    // The others empty the bucket; this node reads it so, then nothing for 10 s.
    store.0 = ((T0.0 + 2_000) * 1000 + 6_000_000) as f64;
    sync(&mut b, &l, &mut store, T0.plus_millis(2_000));
    assert_eq!(drain_in(&mut b, &l, T0.plus_millis(2_000), &f), 0);
    // Ten seconds later the bucket has long been full again: a quarter of 30 and the spread,
    // at most as much again (`settled_allowance`).
    let n = drain_in(&mut b, &l, T0.plus_millis(12_000), &f);
    assert!((14..=15).contains(&n), "{n}");
}

#[test]
fn a_refund_gives_a_young_bucket_its_prior_back() {
    // Prior on 20 replicas: 1.05 × 200 / 20 = 10 tokens of its own, all spent: denied.
    let l = bucket(100, 200);
    let f = fleet(20);
    let mut b = BucketState::default();
    assert_eq!(drain_in(&mut b, &l, T0, &f), 10);
    // Four given back: they fit again, on the prior as on the fleet's bucket (the prior's
    // own bucket kept them spent before, denying until it refilled).
    b.refund_with(&l, T0, 4, &f);
    assert_eq!(drain_in(&mut b, &l, T0, &f), 4);
    assert_eq!(b.pending(), 10);
}

#[test]
fn a_young_bucket_wants_burst_reads_and_then_shares_the_room_they_show() {
    let l = bucket(100, 200);
    let f = fleet(20);
    let mut store = (0.0, 0);
    let mut b = BucketState::default();
    // Prior: 1.05 × 200 / 20 = 10 tokens. Two spent and read: not yet a quarter of it.
    assert_eq!(drain_in(&mut b, &l, T0, &f), 10);
    let mut b = BucketState::default();
    b.record_with(&l, T0, 2, &f);
    sync(&mut b, &l, &mut store, T0.plus_millis(2));
    assert!(!b.wants_burst_read(&l, T0.plus_millis(2), &f));
    b.record_with(&l, T0.plus_millis(2), 2, &f);
    assert!(b.wants_burst_read(&l, T0.plus_millis(2), &f));
    // A burst read shows 190 spent in all (the others' 186): 10 left, half a token each,
    // with a spread of up to a slack of 2: a token, at most.
    store.1 += 186;
    store.0 = ((T0.0 + 4) * 1000 + 188 * 10_000) as f64;
    let mut plan = b.begin_sync();
    plan.burst = true;
    let totals = apply(&mut store, &l, &plan, T0.plus_millis(4));
    b.complete_sync(&l, &plan, totals, T0.plus_millis(4));
    assert!(drain_in(&mut b, &l, T0.plus_millis(4), &f) <= 1);
    // Past the burst window no read is wanted, however much the node spends.
    assert!(!b.wants_burst_read(&l, T0.plus_millis(200), &f));
}

#[test]
fn a_bucket_spent_at_its_refill_rate_is_hot() {
    // The refill is not taken off the pace: a bucket spent a bucketful each interval syncs
    // every tick, however full it stays.
    let l = bucket(5, 30);
    let mut store = (0.0, 0);
    let mut b = BucketState::default();
    for s in 0..3u64 {
        let t = T0.plus_millis(s * 1000);
        b.record_with(&l, t, 5, &FleetView::ALONE);
        sync(&mut b, &l, &mut store, t);
    }
    let t = T0.plus_millis(2_000);
    assert!(b.pressure(&l, t) < 0.5);
    assert!(b.pressure_ahead(&l, t, 16_000, 0) > 0.8);
}

#[test]
fn a_settled_bucket_spending_its_share_wants_a_burst_read_and_is_due_for_it() {
    // A warm fleet flooded everywhere at once: each node re-reads the bucket once it spent an
    // eighth of its even share, so its spread is taken on what the reads show.
    let l = bucket(100, 200);
    let f = fleet(4);
    let policy = crate::core::tier::SyncPolicy::default();
    let mut store = (0.0, 0);
    let mut b = settled_quarter(&l, &mut store);
    let t = T0.plus_millis(2_000);
    assert!(!b.wants_burst_read(&l, t, &f) && !b.read_due(&l, t, policy.tick_ms));
    // An eighth of its even share, 200 / 4: 6.25 tokens.
    b.record_with(&l, t, 6, &f);
    assert!(!b.wants_burst_read(&l, t, &f));
    b.record_with(&l, t, 1, &f);
    assert!(b.wants_burst_read(&l, t, &f));
    let state = crate::core::state::LimitState::Bucket(b);
    assert!(
        policy.due(&state, &l, t, t.0),
        "due at once, not at its tier's interval"
    );
    // The read shows the others spent 150 meanwhile: 43 left, of which this node takes its
    // share with their spread (20), not the 71 of the full bucket.
    store.1 += 150;
    store.0 = store.0.max((t.0 * 1000) as f64) + 150.0 * 10_000.0;
    sync(&mut b, &l, &mut store, t.plus_millis(2));
    let n = drain_in(&mut b, &l, t.plus_millis(2), &f);
    assert!((9..=21).contains(&n), "{n}");
}
