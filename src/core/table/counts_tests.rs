//! Tests of the per-rule counts: `tracked` exact through create, eviction and sweep; near
//! and over crossings counted once a period; a passed period reads 0; candidates bounded; a
//! set nothing uses freed (`release.rs`).

use std::time::Duration;

use super::super::sketch::mix;
use super::super::{CacheSettings, EntityTable, UnixMillis};
use super::*;
use crate::core::{Algorithm, Limit};

const T0: UnixMillis = UnixMillis(1_700_000_040_000);
const RULE: u64 = 42;

fn per_minute(n: u32) -> Limit {
    Limit {
        requests_per_unit: n,
        window_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
    }
}

fn key(i: u64) -> u128 {
    let h = mix(i.wrapping_add(1));
    (u128::from(mix(h)) << 64) | u128::from(h)
}

fn table(max: u64) -> EntityTable {
    EntityTable::new(CacheSettings {
        max_entries: max,
        idle_timeout: Duration::from_secs(60),
        ttl: None,
    })
}

/// Touches `key` of RULE (creating it) and notes a decision at `ratio`: what the request
/// path does (`rls/evaluate.rs`).
fn touch(t: &EntityTable, c: &RuleCounts, k: u128, now: UnixMillis, ratio: f64) -> Option<f64> {
    let l = per_minute(100);
    let p = period_of(now.0, l.window_ms);
    t.with_rule(
        k,
        now,
        || (RULE, vec![l]),
        |e| e.state.marks.update(c, p, ratio, ratio >= 0.8, ratio > 1.0),
    )
    .0
}

#[test]
fn tracked_follows_create_evict_and_sweep_exactly() {
    let t = table(10);
    let c = t.rule_counts(RULE, &[per_minute(100)]);
    let other = t.rule_counts(RULE + 1, &[per_minute(100)]);
    assert!(
        !Arc::ptr_eq(&c, &other),
        "interned per rule, not per limits"
    );
    for i in 0..10 {
        touch(&t, &c, key(i), T0, 0.01);
    }
    assert_eq!(c.tracked(), 10);
    // A full table: each new key evicts one of the rule's.
    for i in 10..25 {
        touch(&t, &c, key(i), T0, 0.01);
    }
    assert_eq!(t.len(), 10);
    assert_eq!(
        c.tracked(),
        10,
        "an eviction takes one out as a creation puts one in"
    );
    assert_eq!(other.tracked(), 0);
    // Past the window and the idle timeout, the sweep drops them all.
    let later = UnixMillis(T0.0 + 180_000);
    assert_eq!(t.sweep(later, 1000), 10);
    assert_eq!(c.tracked(), 0);
}

#[test]
fn crossings_count_once_a_period_and_a_passed_period_reads_zero() {
    let t = table(100);
    let c = t.rule_counts(RULE, &[per_minute(100)]);
    let p = period_of(T0.0, 60_000);
    for ratio in [0.5, 0.8, 0.9, 1.0, 1.01, 1.5, 2.0] {
        touch(&t, &c, key(1), T0, ratio);
    }
    touch(&t, &c, key(2), T0, 0.85);
    assert_eq!((c.near(p), c.over(p)), (2, 1), "each key counted once");
    // The next period: nothing counted yet, and the old counts read 0.
    let next = UnixMillis(T0.0 + 60_000);
    let q = period_of(next.0, 60_000);
    assert_eq!((c.near(q), c.over(q)), (0, 0));
    touch(&t, &c, key(2), next, 0.9);
    assert_eq!(
        (c.near(q), c.over(q)),
        (1, 0),
        "counted again in a new period"
    );
    assert_eq!(c.near(p), 0, "the counter has moved on");
}

#[test]
fn an_entity_is_offered_once_per_step() {
    let t = table(100);
    let c = t.rule_counts(RULE, &[per_minute(100)]);
    let offers =
        [0.001, 0.002, 0.01, 0.04, 0.05, 0.5, 0.5].map(|r| touch(&t, &c, key(1), T0, r).is_some());
    assert_eq!(offers, [true, false, false, true, false, true, false]);
    // A new period starts from step 0 again.
    let next = UnixMillis(T0.0 + 60_000);
    assert!(touch(&t, &c, key(1), next, 0.001).is_some());
}

fn entries(i: u64) -> Vec<(Box<str>, Box<str>)> {
    vec![("user".into(), format!("u{i}").into())]
}

#[test]
fn candidates_keep_the_highest_ratios_and_refuse_below_the_floor() {
    let t = table(10);
    let c = t.rule_counts(RULE, &[per_minute(100)]);
    let cands = &c.candidates;
    let p = 7;
    for i in 0..MAX_CANDIDATES as u64 {
        cands.offer(key(i), 0.1 + i as f64 * 1e-4, p, || entries(i));
    }
    assert_eq!(cands.len(), MAX_CANDIDATES);
    assert!(!cands.could_admit(0.1, p), "at the floor: no lock taken");
    let mut asked = false;
    cands.offer(key(5000), 0.05, p, || {
        asked = true;
        entries(5000)
    });
    assert!(
        !asked,
        "entries are not even built for a key that cannot get in"
    );
    cands.offer(key(5001), 0.9, p, || entries(5001));
    let held: Vec<u128> = cands.snapshot().iter().map(|c| c.key).collect();
    assert_eq!(held.len(), MAX_CANDIDATES);
    assert!(held.contains(&key(5001)));
    assert!(!held.contains(&key(0)), "the lowest left");
    // A new period: old ratios count 0, so any offer gets in.
    assert!(cands.could_admit(0.0001, p + 1));
    // Bytes follow what is held, and forgetting gives them back.
    let bytes: usize = cands
        .snapshot()
        .iter()
        .map(|c| {
            c.entries
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
        })
        .sum();
    assert_eq!(t.candidate_bytes(), bytes);
    cands.forget(|k| k != key(5001));
    assert_eq!(cands.len(), 1);
    assert_eq!(t.candidate_bytes(), 4 + "u5001".len());
}

#[test]
fn the_byte_budget_is_shared_and_never_passed() {
    let t = table(10);
    let a = t.rule_counts(1, &[per_minute(100)]);
    let b = t.rule_counts(2, &[per_minute(100)]);
    let big = "v".repeat(MAX_CANDIDATE_BYTES / 2 - 1);
    let e = || vec![(Box::from("k"), Box::from(big.as_str()))];
    a.candidates.offer(key(1), 0.5, 1, e);
    b.candidates.offer(key(2), 0.5, 1, e);
    b.candidates.offer(key(3), 0.9, 1, e);
    assert_eq!((a.candidates.len(), b.candidates.len()), (1, 1));
    assert!(t.candidate_bytes() <= MAX_CANDIDATE_BYTES);
}

#[test]
fn the_kept_lowest_is_what_a_scan_finds_after_every_offer() {
    // Offers of held and new keys, rising and falling ratios (a record dropped and made
    // again starts low), equal ratios and new periods, past the cap: after each, the lowest
    // kept between offers and the floor are those a scan of the list gives.
    let t = table(10);
    let c = t.rule_counts(RULE, &[per_minute(100)]);
    let cands = &c.candidates;
    let mut x: u64 = 7;
    for n in 0..6_000u64 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let i = (x >> 33) % (MAX_CANDIDATES as u64 + 200);
        let ratio = ((x >> 20) % 16) as f64 / 8.0;
        let period = 1 + (n / 2_000) as u32;
        cands.offer(key(i), ratio, period, || entries(i));
        let mut inner = cands.inner.lock();
        let scanned = lowest(&inner.list, period);
        if let Some(l) = inner.low.filter(|l| l.period == period) {
            assert_eq!(Some((l.at, l.ratio)), scanned, "offer {n}");
        }
        assert_eq!(inner.lowest(period), scanned, "offer {n}");
        let floor = match scanned {
            Some((_, r)) if inner.list.len() >= MAX_CANDIDATES => {
                (u64::from(period) << 32) | u64::from((r as f32).to_bits())
            }
            _ => 0,
        };
        assert_eq!(cands.floor.load(Ordering::Relaxed), floor, "offer {n}");
    }
    assert_eq!(cands.len(), MAX_CANDIDATES);
}

#[test]
fn a_removed_rules_set_is_freed_once_its_records_are_gone_and_its_id_used_again() {
    let t = table(1000);
    let limits = [per_minute(100)];
    // Two rules in force: the compiled rules hold their counts.
    let removed = t.rule_counts(RULE, &limits);
    let kept = t.rule_counts(RULE + 1, &limits);
    touch(&t, &removed, key(1), T0, 0.5);
    let p = period_of(T0.0, 60_000);
    removed
        .candidates
        .offer(key(1), 0.5, p, || vec![("k".into(), "v".into())]);
    assert!(t.candidate_bytes() > 0);
    assert_eq!(t.limit_sets(), 2);
    // A reload drops RULE: its counts are held by nothing but the table, yet a record of it
    // is: kept.
    let gone = Arc::downgrade(&removed);
    drop(removed);
    t.sweep(T0, 1000);
    assert!(gone.upgrade().is_some(), "freed while a record used it");
    assert_eq!(t.limit_sets(), 2);
    // Past the window and the idle timeout the record goes, and the set with it; the rule
    // in force keeps its set, with no record of it.
    let later = UnixMillis(T0.0 + 180_000);
    assert_eq!(t.sweep(later, 1000), 1);
    assert!(gone.upgrade().is_none(), "a set nothing uses was kept");
    assert_eq!(t.limit_sets(), 1);
    assert_eq!(t.candidate_bytes(), 0, "the candidates' bytes given back");
    assert_eq!(kept.tracked(), 0);
    assert!(Arc::ptr_eq(&kept, &t.rule_counts(RULE + 1, &limits)));
    // The freed id is used again: the table's slots do not grow.
    let _again = t.rule_counts(RULE + 2, &limits);
    assert_eq!(t.inner.sets.read().sets.len(), 2);
    assert_eq!(t.limit_sets(), 2);
}

#[test]
fn limits_requests_supply_leave_no_set_behind() {
    let t = table(1000);
    // 200 distinct limits a request supplied (rule id 0), one key each.
    for n in 0..200u32 {
        t.with_rule(
            key(u64::from(n)),
            T0,
            || (0, vec![per_minute(n + 1)]),
            |_| (),
        );
    }
    assert_eq!(t.limit_sets(), 200);
    let later = UnixMillis(T0.0 + 180_000);
    assert_eq!(t.sweep(later, 1000), 200);
    assert_eq!(t.limit_sets(), 0);
    // 200 more reuse the freed slots.
    for n in 200..400u32 {
        t.with_rule(
            key(u64::from(n)),
            later,
            || (0, vec![per_minute(n + 1)]),
            |_| (),
        );
    }
    assert_eq!(t.limit_sets(), 200);
    assert_eq!(t.inner.sets.read().sets.len(), 200);
}

#[test]
fn offers_in_list_order_in_a_new_period_keep_the_lowest_a_scan_finds() {
    // The load of `benches/cpu.sh`: every key held, and in a new period each offered in the
    // order it was admitted, so each offer raises the lowest (then the next one is it).
    let t = table(10);
    let c = t.rule_counts(RULE, &[per_minute(100)]);
    let cands = &c.candidates;
    for i in 0..MAX_CANDIDATES as u64 {
        cands.offer(key(i), 0.25, 1, || entries(i));
    }
    for i in 0..MAX_CANDIDATES as u64 {
        cands.offer(key(i), 0.5, 2, || entries(i));
        let mut inner = cands.inner.lock();
        let scanned = lowest(&inner.list, 2);
        assert_eq!(inner.lowest(2), scanned, "offer {i}");
        let want = if i + 1 < MAX_CANDIDATES as u64 {
            0.0
        } else {
            0.5
        };
        assert_eq!(scanned.map(|(_, r)| r), Some(want), "offer {i}");
    }
}
