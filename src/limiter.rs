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
/// In local mode only `pending` ever moves. In global mode a sync moves `pending` to
/// `inflight` ([`WindowState::begin_sync`]) and the reply moves it into `remote`
/// ([`WindowState::complete_sync`]), so a node's own hits are counted exactly once whether or
/// not a sync is in flight. Between syncs, other nodes' hits are extrapolated from the rate
/// seen between replies.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowState {
    slots: [Slot; 2],
    /// When the last sync reply arrived (Unix ms); 0 before the first.
    synced_at: u64,
    /// Other nodes' hits per second, from consecutive replies (EWMA).
    others_per_sec: f32,
}

/// What one sync sends and reads for one limit: the deltas of the current and previous epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// The current and the previous epoch.
    pub epochs: [u64; 2],
    /// Own hits to add to each epoch's counter (0: read only).
    pub deltas: [i64; 2],
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
        let s = &mut self.slots[(epoch % 2) as usize];
        if s.epoch < epoch {
            // Anything still here is two windows old: no estimate reads it any more.
            *s = Slot {
                epoch,
                ..Slot::default()
            };
        }
        s
    }

    /// Other nodes' hits expected in the current epoch since the last reply.
    fn extrapolated(&self, limit: &Limit, now: UnixMillis) -> u64 {
        if self.synced_at == 0 || self.others_per_sec <= 0.0 {
            return 0;
        }
        let epoch_start = now.0 - now.0 % limit.window_ms;
        let since = self.synced_at.max(epoch_start);
        let secs = now.0.saturating_sub(since) as f64 / 1000.0;
        ((f64::from(self.others_per_sec) * secs) as u64).min(u64::from(limit.requests_per_unit))
    }

    /// The count the limit sees at `now`, before any new hits.
    fn estimate(&self, limit: &Limit, now: UnixMillis) -> u64 {
        // A clock that stepped back reads the newest counts rather than none.
        let epoch = (now.0 / limit.window_ms).max(self.newest_epoch());
        let curr = self.count(epoch) + self.extrapolated(limit, now);
        match limit.algorithm {
            Algorithm::FixedWindow => curr,
            Algorithm::SlidingWindow => {
                let prev = if epoch == 0 { 0 } else { self.count(epoch - 1) };
                let w = limit.window_ms as u128;
                let left = w - (now.0 % limit.window_ms) as u128;
                (prev as u128 * left / w) as u64 + curr
            }
        }
    }

    /// Checks `hits` at `now` without counting them.
    pub fn check(&mut self, limit: &Limit, now: UnixMillis, hits: u64) -> Verdict {
        let count_after = self.estimate(limit, now).saturating_add(hits);
        let rpu = u64::from(limit.requests_per_unit);
        let over = rpu == 0 || count_after > rpu;
        Verdict {
            count_after,
            over,
            remaining: if over { 0 } else { (rpu - count_after) as u32 },
            reset_ms: limit.window_ms - now.0 % limit.window_ms,
        }
    }

    /// Counts `hits` at `now`. `admitted` says whether the request they belong to was let
    /// through: the sliding window counts only admitted hits, the fixed window every hit.
    pub fn record(&mut self, limit: &Limit, now: UnixMillis, hits: u64, admitted: bool) {
        if admitted || limit.algorithm == Algorithm::FixedWindow {
            let s = self.slot_mut(now.0 / limit.window_ms);
            s.pending = s.pending.saturating_add(hits as i64);
        }
    }

    /// Gives `hits` back to the current window (Envoy's `is_negative_hits`).
    pub fn refund(&mut self, limit: &Limit, now: UnixMillis, hits: u64) {
        let epoch = now.0 / limit.window_ms;
        let have = self.count(epoch) as i64;
        let s = self.slot_mut(epoch);
        // Never below zero overall; in global mode the negative delta reaches Redis too.
        s.pending -= (hits as i64).min(have);
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

    /// Starts a sync at `now`: the pending hits of the current and previous epoch become
    /// in-flight, to be added to the fleet's counters by the store.
    pub fn begin_sync(&mut self, limit: &Limit, now: UnixMillis) -> SyncPlan {
        let epoch = now.0 / limit.window_ms;
        // A read of an entity this node has not counted yet still needs a slot to land in.
        self.slot_mut(epoch);
        if epoch > 0 {
            let prev = &mut self.slots[((epoch - 1) % 2) as usize];
            if prev.epoch < epoch - 1 {
                *prev = Slot {
                    epoch: epoch - 1,
                    ..Slot::default()
                };
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
    /// were added. Updates the estimate of other nodes' rate.
    pub fn complete_sync(&mut self, limit: &Limit, plan: &SyncPlan, totals: [u64; 2], now: UnixMillis) {
        let epoch_start = plan.epochs[0] * limit.window_ms;
        for i in 0..2 {
            let s = &mut self.slots[(plan.epochs[i] % 2) as usize];
            if s.epoch != plan.epochs[i] {
                continue; // the window moved on; nothing left to settle
            }
            s.inflight -= plan.deltas[i];
            if i == 0 {
                // Other nodes' hits since the last reply (or since the epoch began).
                let others = totals[0] as i64 - s.remote as i64 - plan.deltas[0];
                let since = self.synced_at.max(epoch_start);
                let secs = now.0.saturating_sub(since) as f32 / 1000.0;
                if others >= 0 && secs >= 0.05 {
                    let rate = others as f32 / secs;
                    self.others_per_sec = if self.synced_at == 0 {
                        rate
                    } else {
                        0.5 * self.others_per_sec + 0.5 * rate
                    };
                }
            }
            s.remote = s.remote.max(totals[i]);
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

    /// Whether a limit state last synced at `last_sync_ms` is due at `now`. A state that never
    /// synced is due at once: a cold entity learns the fleet's count on the first tick after
    /// its first hit, which is what keeps a surge spread over many nodes from running far
    /// past the limit before any node notices.
    pub fn due(&self, state: &WindowState, limit: &Limit, now: UnixMillis, last_sync_ms: u64) -> bool {
        if !state.ever_synced() {
            return true;
        }
        let tier = Tier::of(state.pressure(limit, now));
        now.0.saturating_sub(last_sync_ms) + self.tick_ms / 2 >= self.interval_ms(tier)
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
        let mut totals = [0; 2];
        for i in 0..2 {
            let v = store.entry(plan.epochs[i]).or_default();
            *v = (*v as i64 + plan.deltas[i]) as u64;
            totals[i] = *v;
        }
        totals
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
        assert_eq!((s.pending(), s.check(&l, T0.plus_millis(40), 0).count_after), (0, 5));
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
}
