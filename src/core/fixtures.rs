//! Shared test fixtures of the core (and of global mode's tests): minute limits, an aligned
//! start time, a fake store, and one request on one bare state through [`decide`].

use std::collections::HashMap;

use super::bucket::BucketState;
use super::clock::UnixMillis;
use super::decide::{decide, Count};
use super::limit::{Algorithm, Limit, Verdict};
use super::state::LimitState;
use super::window::{Held, Part, SyncPlan, WindowState};

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

/// A fake fleet counter per epoch with a part per node (`(epoch, node)`), as Redis holds it:
/// the node's part takes in what the node states as `sync.lua` does ([`Held::state`]).
/// Returns the sums, each no less than the plan's floor less the refunds the counter applied.
pub fn apply_as(store: &mut PartStore, node: u64, plan: &SyncPlan) -> [u64; 2] {
    let epochs = if plan.epochs[0] == plan.epochs[1] {
        1
    } else {
        2
    };
    for i in 0..epochs {
        let said = plan.parts[i];
        if said != Part::default() {
            let e = plan.epochs[i];
            let mine = store.get(&(e, node)).copied().unwrap_or_default();
            let others = part(store, e) - mine.net();
            store.entry((e, node)).or_default().state(said, others);
        }
    }
    std::array::from_fn(|i| {
        let refunds: u64 = store
            .iter()
            .filter(|((e, _), _)| *e == plan.epochs[i])
            .map(|(_, p)| p.applied())
            .sum();
        let floor = plan.floors[i].saturating_sub(refunds) as i64;
        part(store, plan.epochs[i]).max(floor).max(0) as u64
    })
}

/// Each node's part of each epoch's counter, keyed by `(epoch, node)`.
pub type PartStore = HashMap<(u64, u64), Held>;

/// The sum of every node's part of `epoch`'s counter in an [`apply_as`] store.
pub fn part(store: &PartStore, epoch: u64) -> i64 {
    store
        .iter()
        .filter(|((e, _), _)| *e == epoch)
        .map(|(_, p)| p.net())
        .sum()
}

/// Syncs `s` as node `node` with an [`apply_as`] store at `t` (the reply lands at once).
pub fn sync_as(s: &mut WindowState, node: u64, l: &Limit, store: &mut PartStore, t: UnixMillis) {
    let plan = s.begin_sync(l, t);
    let totals = apply_as(store, node, &plan);
    s.complete_sync(l, &plan, totals, t);
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
        .take_while(|_| !hit_lenient(s, l, t, 1).over)
        .count() as u64
}

/// A state a test holds bare (one limit's), which [`decide`] takes as a one-limit rule's.
pub trait Bare: Copy {
    fn wrap(self) -> LimitState;
    fn unwrap(s: LimitState) -> Self;
}

impl Bare for LimitState {
    fn wrap(self) -> LimitState {
        self
    }
    fn unwrap(s: LimitState) -> Self {
        s
    }
}

impl Bare for WindowState {
    fn wrap(self) -> LimitState {
        LimitState::Window(self)
    }
    fn unwrap(s: LimitState) -> Self {
        match s {
            LimitState::Window(w) => w,
            LimitState::Bucket(_) => unreachable!("a window stays a window"),
        }
    }
}

impl Bare for BucketState {
    fn wrap(self) -> LimitState {
        LimitState::Bucket(self)
    }
    fn unwrap(s: LimitState) -> Self {
        match s {
            LimitState::Bucket(b) => b,
            LimitState::Window(_) => unreachable!("a bucket stays a bucket"),
        }
    }
}

/// One request of `hits` on a `strict` limit (the default) in local mode, through
/// [`decide`]: checked, and counted whether admitted or not (the reference's `INCRBY`).
pub fn hit<S: Bare>(s: &mut S, l: &Limit, t: UnixMillis, hits: u64) -> Verdict {
    one(s, l, true, t, hits)
}

/// As [`hit`] on a lenient limit (`strict: false`): denied hits cost nothing.
pub fn hit_lenient<S: Bare>(s: &mut S, l: &Limit, t: UnixMillis, hits: u64) -> Verdict {
    one(s, l, false, t, hits)
}

fn one<S: Bare>(s: &mut S, l: &Limit, strict: bool, t: UnixMillis, hits: u64) -> Verdict {
    let mut states = [s.wrap()];
    let count = Count::Yes { hold_within: false };
    let d = decide([(l, strict)], &mut states, t, hits, count, None).expect("one limit");
    *s = S::unwrap(states[0]);
    d.outcome.verdict
}
