//! Shared test fixtures of the core: minute limits, an aligned start time and a fake store.

use std::collections::HashMap;

use super::clock::UnixMillis;
use super::fleet::SyncPlan;
use super::window::{decide_lenient, Algorithm, Limit, WindowState};

pub const MIN: u64 = 60_000;

pub fn sliding(rpu: u32) -> Limit {
    Limit {
        requests_per_unit: rpu,
        window_ms: MIN,
        algorithm: Algorithm::SlidingWindow,
    }
}

pub fn fixed(rpu: u32) -> Limit {
    Limit {
        algorithm: Algorithm::FixedWindow,
        ..sliding(rpu)
    }
}

/// Start of some minute-aligned window.
pub const T0: UnixMillis = UnixMillis(1_700_000_040_000);

/// A fake fleet counter per epoch, as Redis would hold it.
pub fn apply(store: &mut HashMap<u64, u64>, plan: &SyncPlan) -> [u64; 2] {
    std::array::from_fn(|i| {
        let v = store.entry(plan.epochs[i]).or_default();
        *v = (*v as i64 + plan.deltas[i]) as u64;
        *v
    })
}

// === global mode: fleet accuracy ===

/// Syncs `s` with the fake store at `t` (the reply lands at once).
pub fn sync(s: &mut WindowState, l: &Limit, store: &mut HashMap<u64, u64>, t: UnixMillis) {
    let plan = s.begin_sync(l, t);
    let totals = apply(store, &plan);
    s.complete_sync(l, &plan, totals, t);
}

/// Decides single hits at `t` while they fit; returns how many were admitted.
pub fn admit_all(s: &mut WindowState, l: &Limit, t: UnixMillis) -> u64 {
    // The first hit that does not fit is not counted either: it stands for traffic that
    // stopped there, not for a denied request (which a strict limit would count).
    (0..10_000)
        .take_while(|_| !decide_lenient(s, l, t, 1).over)
        .count() as u64
}
