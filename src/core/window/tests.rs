//! Tests of the window states: the formulas, counting, refunds and concurrency, with a
//! manual clock.

use super::*;
use crate::core::fixtures::*;

#[test]
fn reaching_the_limit_exactly_is_ok_with_zero_left() {
    let mut s = WindowState::default();
    for left in (0..3).rev() {
        let v = hit(&mut s, &fixed(3), T0, 1);
        assert!(!v.over);
        assert_eq!(v.remaining, left);
    }
    let v = hit(&mut s, &fixed(3), T0, 1);
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
        hit(&mut s, &l, T0.plus_millis(59_000), 1);
    }
    assert_eq!(s.current_count(&l, T0.plus_millis(59_000)), 5);
    let v = hit(&mut s, &l, T0.plus_millis(60_000), 1);
    assert!(!v.over);
    assert_eq!(v.remaining, 1);
}

#[test]
fn sliding_window_weights_the_previous_epoch_by_time_left() {
    let l = sliding(10);
    let mut s = WindowState::default();
    for _ in 0..10 {
        assert!(!hit(&mut s, &l, T0, 1).over);
    }
    assert!(s.check(&l, T0, 1).over, "the 11th hit is over");
    // A quarter into the next window, 75 % of the previous 10 still count: 7 (floored).
    let q = T0.plus_millis(MIN + MIN / 4);
    assert_eq!(s.check(&l, q, 0).count_after, 7);
    for _ in 0..3 {
        assert!(!hit(&mut s, &l, q, 1).over);
    }
    assert!(hit(&mut s, &l, q, 1).over);
    // Two windows later everything has aged out.
    assert_eq!(s.check(&l, T0.plus_millis(3 * MIN), 0).count_after, 0);
}

#[test]
fn denied_hits_are_counted_unless_lenient() {
    let l = sliding(1);
    let (mut strict, mut lenient) = (WindowState::default(), WindowState::default());
    hit(&mut strict, &l, T0, 1);
    hit_lenient(&mut lenient, &l, T0, 1);
    for _ in 0..100 {
        assert!(hit(&mut strict, &l, T0, 1).over);
        assert!(hit_lenient(&mut lenient, &l, T0, 1).over);
    }
    // Half-way through the next window half of the previous epoch still counts: the 101
    // hits (all counted, as the reference's INCRBY) keep denying; of the lenient 1
    // admitted hit, nothing is left.
    let half = T0.plus_millis(MIN + MIN / 2);
    assert_eq!(strict.check(&l, half, 0).count_after, 50);
    assert!(hit(&mut strict, &l, half, 1).over);
    assert_eq!(lenient.check(&l, half, 0).count_after, 0);
    assert!(!hit_lenient(&mut lenient, &l, half, 1).over);
}

#[test]
fn an_over_limit_count_stays_over_until_it_drains() {
    // The reference's INCRBY: 6 then 6 against 10 leaves 12 counted, so even a check of
    // 0 hits is over until the window moves on.
    let mut s = WindowState::default();
    let l = fixed(10);
    assert!(!hit(&mut s, &l, T0, 6).over);
    let v = hit(&mut s, &l, T0, 6);
    assert_eq!((v.over, v.remaining, v.count_after), (true, 0, 12));
    assert!(hit(&mut s, &l, T0, 0).over);
    assert!(!hit(&mut s, &l, T0.plus_millis(MIN), 0).over);
}

#[test]
fn zero_hits_checks_without_counting() {
    let mut s = WindowState::default();
    let l = fixed(1);
    for _ in 0..3 {
        let v = hit(&mut s, &l, T0, 0);
        assert!(!v.over);
        assert_eq!(v.remaining, 1);
    }
    hit(&mut s, &l, T0, 1);
    let v = hit(&mut s, &l, T0, 0);
    assert_eq!((v.over, v.remaining), (false, 0));
}

#[test]
fn zero_limit_always_denies() {
    let mut s = WindowState::default();
    for hits in [0, 1, 5] {
        for l in [fixed(0), sliding(0)] {
            assert!(hit(&mut s, &l, T0, hits).over);
        }
    }
}

#[test]
fn a_big_addend_is_denied_whole() {
    let l = sliding(10);
    let (mut strict, mut lenient) = (WindowState::default(), WindowState::default());
    for s in [&mut strict, &mut lenient] {
        assert!(!hit(s, &l, T0, 8).over);
    }
    assert!(hit(&mut strict, &l, T0, 5).over);
    assert!(hit_lenient(&mut lenient, &l, T0, 5).over);
    // Counted, the denied 5 leave no room; not counted, 2 more still fit.
    assert!(hit(&mut strict, &l, T0, 2).over);
    assert!(!hit_lenient(&mut lenient, &l, T0, 2).over);
}

#[test]
fn a_huge_addend_saturates_the_count_instead_of_wrapping() {
    for l in [fixed(100), sliding(100)] {
        let mut s = WindowState::default();
        assert!(hit(&mut s, &l, T0, 101).over);
        // 101 + (2^64 − 101) would wrap to 0 in u64 (and was -101 as an i64).
        let v = hit(&mut s, &l, T0, u64::MAX - 100);
        assert_eq!((v.over, v.remaining), (true, 0));
        assert_eq!(s.current_count(&l, T0), MAX_COUNT);
        for hits in [0, 1, u64::MAX] {
            assert!(hit(&mut s, &l, T0, hits).over, "{hits}");
        }
        assert_eq!(s.current_count(&l, T0), MAX_COUNT);
        assert_eq!(s.pending(), MAX_COUNT as i64);
    }
}

#[test]
fn a_huge_refund_empties_the_count_and_never_adds() {
    for l in [fixed(100), sliding(100)] {
        let mut s = WindowState::default();
        hit(&mut s, &l, T0, 7);
        // 2^63 as an i64 is negative: subtracting it used to add 2^63 hits.
        s.refund(&l, T0, 1 << 63);
        assert_eq!(s.current_count(&l, T0), 0);
        s.refund(&l, T0, u64::MAX);
        assert_eq!((s.current_count(&l, T0), s.pending()), (0, 0));
        assert!(!hit(&mut s, &l, T0, 100).over);
    }
}

#[test]
fn a_clock_step_back_keeps_counts() {
    let mut s = WindowState::default();
    let l = fixed(1);
    hit(&mut s, &l, T0.plus_millis(MIN), 1);
    assert!(hit(&mut s, &l, T0, 1).over);
}

fn concurrency(n: u32) -> Limit {
    Limit {
        requests_per_unit: n,
        window_ms: MIN,
        algorithm: Algorithm::Concurrency,
    }
}

#[test]
fn concurrency_counts_acquisitions_until_released_or_lapsed() {
    let l = concurrency(2);
    let mut s = WindowState::default();
    // Two acquisitions fit, a third does not (and is not counted: lenient).
    assert!(!hit_lenient(&mut s, &l, T0, 1).over);
    let t = T0.plus_millis(30_000);
    assert!(!hit_lenient(&mut s, &l, t, 1).over);
    assert!(hit_lenient(&mut s, &l, t, 1).over);
    // A release frees a place.
    s.refund(&l, t, 1);
    assert!(!hit_lenient(&mut s, &l, t, 1).over);
    // Never released, they count whole through the next window (no decay)...
    let next = T0.plus_millis(2 * MIN - 1);
    let v = s.check(&l, next, 0);
    assert_eq!((v.count_after, v.remaining, v.reset_ms), (2, 0, 1));
    assert!(s.check(&l, next, 1).over);
    // ...and lapse when their window leaves (a lease of a minute: one to two leases on).
    let later = T0.plus_millis(2 * MIN);
    assert_eq!(s.check(&l, later, 0).count_after, 0);
    // A release that comes after its acquisition lapsed takes nothing below zero: the
    // limit's two places are still there.
    s.refund(&l, later, 5);
    assert_eq!(s.check(&l, later, 0).count_after, 0);
    assert!(!hit_lenient(&mut s, &l, later, 2).over);
    assert!(hit_lenient(&mut s, &l, later, 1).over);
}

#[test]
fn a_release_takes_the_oldest_acquisition_so_none_in_flight_lapses_before_its_lease() {
    let l = concurrency(2);
    let mut s = WindowState::default();
    // A acquires late in a window, B early in the next; then A is released.
    hit_lenient(&mut s, &l, T0.plus_millis(50_000), 1);
    let b = T0.plus_millis(MIN + 1_000);
    hit_lenient(&mut s, &l, b, 1);
    s.refund(&l, b.plus_millis(1_000), 1);
    // B, still in flight, counts until a lease after it was acquired and beyond (taking
    // the release from B's window instead would leave A's count, which lapses 59 s
    // after B was acquired).
    for at in [T0.plus_millis(2 * MIN), b.plus_millis(MIN)] {
        assert_eq!(s.check(&l, at, 0).count_after, 1, "{at:?}");
    }
    assert_eq!(s.check(&l, T0.plus_millis(3 * MIN), 0).count_after, 0);
}

#[test]
fn a_release_after_its_lapse_frees_at_most_its_own_hits_of_another() {
    // A's 2 places lapsed unreleased; C holds one of 2. A release of 3 comes late: it takes
    // C's count and nothing below zero, so one admission beyond the limit while C runs (C's
    // place), not three.
    let l = concurrency(2);
    let mut s = WindowState::default();
    hit_lenient(&mut s, &l, T0, 2);
    let t = T0.plus_millis(2 * MIN);
    hit_lenient(&mut s, &l, t, 1);
    s.refund(&l, t, 3);
    assert_eq!(s.check(&l, t, 0).count_after, 0);
    assert!(!hit_lenient(&mut s, &l, t, 2).over);
    assert!(
        hit_lenient(&mut s, &l, t, 1).over,
        "C and two more: no fourth"
    );
}

#[test]
fn the_state_stays_small() {
    // Memory per entity is a target (ARCHITECTURE.md, "Targets"): the fleet-accuracy fields
    // cost 8 bytes, the refunds that make a sync idempotent 8 more.
    assert!(std::mem::size_of::<WindowState>() <= 96);
}

#[test]
fn a_node_that_gave_back_more_than_it_counted_still_takes_a_share_of_the_room() {
    // 10 places on two nodes: 5 held through each, read by both; then each releases all 10
    // (a release retried through the other node). The store keeps the count at 0; each
    // node's own part is 5 below zero. Neither may stall on it (taken as a share of
    // nothing, the floor, the two admitted 5), nor admit past the places: of 40
    // acquisitions, alternating, each node reading the count before each, exactly 10 fit.
    let l = Limit {
        algorithm: Algorithm::Concurrency,
        ..fixed(10)
    };
    let fleet = FleetView {
        live: 2,
        ..FleetView::ALONE
    };
    let mut store = PartStore::new();
    let mut nodes = [WindowState::default(), WindowState::default()];
    let sync_all = |nodes: &mut [WindowState; 2], store: &mut PartStore, t| {
        for (n, s) in nodes.iter_mut().enumerate() {
            sync_as(s, n as u64, &l, store, t);
        }
    };
    for s in &mut nodes {
        s.record(&l, T0, 5);
    }
    sync_all(&mut nodes, &mut store, T0);
    sync_all(&mut nodes, &mut store, T0.plus_millis(1_000));
    for s in &mut nodes {
        assert_eq!(
            s.check_with(&l, T0.plus_millis(1_000), 0, &fleet)
                .count_after,
            10
        );
        s.refund(&l, T0.plus_millis(1_000), 10);
    }
    let mut t = T0.plus_millis(2_000);
    sync_all(&mut nodes, &mut store, t);
    assert_eq!(part(&store, T0.0 / MIN), 0);
    let mut admitted = 0;
    for i in 0..40 {
        t = t.plus_millis(7);
        let s = &mut nodes[i % 2];
        if !s.check_with(&l, t, 1, &fleet).over {
            s.record(&l, t, 1);
            admitted += 1;
        }
        sync_all(&mut nodes, &mut store, t);
    }
    assert_eq!((admitted, part(&store, T0.0 / MIN)), (10, 10));
}
