//! The entity table's tests: lookups, eviction order, the sketch's over-estimate, the sweep.

use super::sketch::mix;
use super::*;
use crate::core::{Algorithm, FleetView};

const T0: UnixMillis = UnixMillis(1_700_000_040_000);

fn per_minute(n: u32) -> Limit {
    Limit {
        requests_per_unit: n,
        window_ms: 60_000,
        algorithm: Algorithm::SlidingWindow,
    }
}

fn bucket(rate_per_s: u32, burst: u32) -> Limit {
    Limit {
        requests_per_unit: rate_per_s,
        window_ms: 1000,
        algorithm: Algorithm::TokenBucket { burst },
    }
}

fn table(max: u64) -> EntityTable {
    EntityTable::new(CacheSettings {
        max_entries: max,
        ..CacheSettings::default()
    })
}

/// Counts `hits` on `key` at `now` if they fit; whether they did.
fn hit(t: &EntityTable, key: u128, limits: &[Limit], now: UnixMillis, hits: u64) -> bool {
    t.with(
        key,
        now,
        || limits.to_vec(),
        |e| {
            let fits = e
                .state
                .states
                .iter_mut()
                .zip(limits)
                .all(|(s, l)| !s.check_with(l, now, hits, &FleetView::ALONE).over);
            if fits {
                for (s, l) in e.state.states.iter_mut().zip(limits) {
                    s.record_with(l, now, hits, &FleetView::ALONE);
                }
            }
            fits
        },
    )
    .0
}

fn held(t: &EntityTable, key: u128) -> bool {
    t.get(key, |_| ()).is_some()
}

/// Distinct keys spread over the shards as the rules' XXH3 keys are.
fn key(i: u64) -> u128 {
    let h = mix(i.wrapping_add(1));
    (u128::from(mix(h)) << 64) | u128::from(h)
}

#[test]
fn an_entity_keeps_its_counts_between_lookups() {
    let t = table(100);
    let l = [per_minute(2)];
    let (_, first) = t.with(key(1), T0, || l.to_vec(), |_| ());
    assert_eq!(first, Lookup::Miss);
    assert!(hit(&t, key(1), &l, T0, 1));
    assert!(hit(&t, key(1), &l, T0, 1));
    assert!(!hit(&t, key(1), &l, T0, 1), "the third hit of 2/min");
    let (_, again) = t.with(key(1), T0, || l.to_vec(), |_| ());
    assert_eq!(again, Lookup::Hit);
    assert_eq!(t.len(), 1);
}

#[test]
fn a_rule_of_several_limits_keeps_one_state_each() {
    let t = table(100);
    let l = [per_minute(5), bucket(1, 2)];
    assert!(hit(&t, key(1), &l, T0, 2));
    assert!(!hit(&t, key(1), &l, T0, 1), "the bucket of 2 is empty");
    let n = t.get(key(1), |e| (e.state.states.len(), t.limits(e.set).len()));
    assert_eq!(n, Some((2, 2)));
}

#[test]
fn a_full_table_evicts_what_holds_nothing_first_then_the_least_recently_used() {
    let t = table(3);
    let l = [per_minute(10)];
    // The oldest use, but still counting: a live entity.
    assert!(hit(&t, key(1), &l, T0, 4));
    // Used later, its window passes: it holds nothing by the time the table is full.
    assert!(hit(&t, key(2), &l, UnixMillis(T0.0 - 120_000), 1));
    t.with(key(2), UnixMillis(T0.0 + 1000), || l.to_vec(), |_| ());
    assert!(hit(&t, key(3), &l, UnixMillis(T0.0 + 2000), 1));
    let later = UnixMillis(T0.0 + 3000);
    assert!(hit(&t, key(4), &l, later, 1));
    assert!(!held(&t, key(2)), "the entity holding nothing goes first");
    assert!(held(&t, key(1)) && held(&t, key(3)));
    assert_eq!(t.stats().evicted_free.load(Ordering::Relaxed), 1);
    assert!(hit(&t, key(5), &l, later, 1));
    assert!(!held(&t, key(1)), "then the least recently used");
    assert!(held(&t, key(3)) && held(&t, key(4)));
    assert_eq!(t.stats().evicted_live.load(Ordering::Relaxed), 1);
    // It comes back counting the 4 it had, not 0: 6 more fit, the 7th does not.
    assert!(hit(&t, key(1), &l, later, 6));
    assert!(!hit(&t, key(1), &l, later, 1));
    assert_eq!(t.stats().restored.load(Ordering::Relaxed), 1);
}

#[test]
fn a_peek_reads_a_held_entity_and_an_evicted_ones_summary_and_creates_nothing() {
    let t = table(1);
    let l = [per_minute(10)];
    let count = |states: Option<Vec<LimitState>>| {
        let mut s = states.expect("states");
        s[0].check_with(&l[0], T0, 0, &FleetView::ALONE).count_after
    };
    assert!(hit(&t, key(1), &l, T0, 4));
    assert_eq!(count(t.peek(key(1), &l, T0)), 4);
    // Evicted while counting: its next request starts from the summary's 4, and so does
    // a peek; a value never seen reads nothing, and neither peek creates an entity.
    assert!(hit(&t, key(2), &l, T0, 1));
    assert!(!held(&t, key(1)));
    assert_eq!(count(t.peek(key(1), &l, T0)), 4);
    assert_eq!(t.peek(key(3), &l, T0), None);
    assert!(!held(&t, key(1)) && !held(&t, key(3)) && held(&t, key(2)));
}

#[test]
fn a_victim_over_its_limit_stays_over_through_a_flood_of_values_and_new_values_pass() {
    let t = table(1000);
    let l = [per_minute(10)];
    let victim = key(u64::MAX);
    for _ in 0..10 {
        assert!(hit(&t, victim, &l, T0, 1));
    }
    assert!(!hit(&t, victim, &l, T0, 1));
    // An attacker sends 5,000 distinct values, once each.
    for i in 0..5000 {
        let now = UnixMillis(T0.0 + 1000 + i * 10);
        assert!(hit(&t, key(i), &l, now, 1), "value {i}");
    }
    assert!(!held(&t, victim), "the flood evicted the victim");
    assert!(t.len() <= 1000);
    let now = UnixMillis(T0.0 + 55_000);
    assert!(!hit(&t, victim, &l, now, 1), "the victim is still over");
    // Values never seen are admitted (the sketch's collisions stay below their limit).
    for i in 10_000..10_200 {
        assert!(hit(&t, key(i), &l, now, 1), "fresh value {i}");
    }
    // A minute and a window later the victim's count has passed, sketch or not.
    let later = UnixMillis(T0.0 + 121_000);
    assert!(hit(&t, victim, &l, later, 10));
}

#[test]
fn an_evicted_empty_bucket_comes_back_empty() {
    let t = table(2);
    let l = [bucket(1, 5)];
    let at = |ms| UnixMillis(T0.0 + ms);
    assert!(hit(&t, key(1), &l, at(0), 5));
    assert!(hit(&t, key(2), &l, at(1100), 5));
    assert!(hit(&t, key(3), &l, at(1200), 1));
    assert!(!held(&t, key(1)), "the least recently used");
    // 1.3 tokens back since it was emptied, as if it had stayed: one fits, not two.
    assert!(hit(&t, key(1), &l, at(1300), 1));
    assert!(!hit(&t, key(1), &l, at(1300), 1), "no fuller than it was");
}

#[test]
fn entities_a_sync_holds_are_never_evicted() {
    let t = table(2);
    let l = [per_minute(10)];
    for k in [key(1), key(2)] {
        t.with(k, T0, || l.to_vec(), |e| e.state.queued = true);
    }
    assert!(hit(&t, key(3), &l, T0, 1));
    assert!(held(&t, key(1)) && held(&t, key(2)) && held(&t, key(3)));
    assert_eq!(t.stats().over_bound.load(Ordering::Relaxed), 1);
}

#[test]
fn the_sweep_drops_idle_entities_that_hold_nothing_and_past_ttl_folds_the_rest() {
    let t = EntityTable::new(CacheSettings {
        max_entries: 100,
        idle_timeout: Duration::from_secs(60),
        ttl: Some(Duration::from_secs(600)),
    });
    let l = [Limit {
        window_ms: 3_600_000,
        ..per_minute(10)
    }];
    let short = [per_minute(10)];
    assert!(hit(&t, key(1), &short, T0, 3)); // passes in two minutes
    assert!(hit(&t, key(2), &l, T0, 3)); // counts for two hours
    assert_eq!(t.sweep(UnixMillis(T0.0 + 59_000), 100), 0, "not idle yet");
    assert_eq!(t.sweep(UnixMillis(T0.0 + 180_000), 100), 1);
    assert!(!held(&t, key(1)) && held(&t, key(2)), "the live one stays");
    assert_eq!(t.stats().expired_idle.load(Ordering::Relaxed), 1);
    let past_ttl = UnixMillis(T0.0 + 601_000);
    assert_eq!(t.sweep(past_ttl, 100), 1);
    assert!(t.is_empty());
    assert_eq!(t.stats().expired_ttl.load(Ordering::Relaxed), 1);
    assert!(hit(&t, key(2), &l, past_ttl, 7));
    assert!(!hit(&t, key(2), &l, past_ttl, 1), "it came back counting 3");
}

#[test]
fn the_bound_is_the_setting_and_a_record_stays_small() {
    for max in [1, 3, 8192, 1_000_000] {
        assert_eq!(table(max).capacity(), max);
    }
    let t = table(1);
    let l = [per_minute(1)];
    assert!(hit(&t, key(1), &l, T0, 1));
    assert!(hit(&t, key(2), &l, T0, 1));
    assert_eq!(t.len(), 1);
    // docs/performance.md's memory figure rests on this (records are most of an entity's bytes).
    assert!(
        std::mem::size_of::<Record>() <= 144,
        "{}",
        std::mem::size_of::<Record>()
    );
}

#[test]
fn the_index_follows_records_through_churn() {
    let t = table(20_000);
    let l = [per_minute(100)];
    for i in 0..60_000u64 {
        // Every third key returns: hits, misses and evictions interleave.
        let k = if i % 3 == 0 { key(i / 3) } else { key(i) };
        hit(&t, k, &l, UnixMillis(T0.0 + i), 1);
    }
    let held: u64 = (0..60_000u64)
        .filter(|&i| t.get(key(i), |e| assert_eq!(e.key, key(i))).is_some())
        .count() as u64;
    assert_eq!(held, t.len());
    assert_eq!(t.len(), 20_000, "full, and never past the bound");
    let s = t.stats();
    let gone = s.evicted_free.load(Ordering::Relaxed) + s.evicted_live.load(Ordering::Relaxed);
    assert!(gone >= 60_000 - 20_000 - 60_000 / 3, "{gone}");
}
