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

/// Counters of one limit of one entity: the current epoch and the counts of it and the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowState {
    epoch: u64,
    curr: u64,
    prev: u64,
}

// === impl WindowState ===

impl WindowState {
    /// Moves the state to the epoch of `now`, shifting or clearing counts as windows pass.
    fn roll(&mut self, limit: &Limit, now: UnixMillis) {
        let epoch = now.0 / limit.window_ms;
        if epoch == self.epoch {
            return;
        }
        // A clock that steps back keeps the newer epoch's counts rather than forgetting them.
        if epoch < self.epoch {
            return;
        }
        self.prev = if epoch == self.epoch + 1 {
            self.curr
        } else {
            0
        };
        self.curr = 0;
        self.epoch = epoch;
    }

    /// The count the limit sees at `now`, before any new hits.
    fn estimate(&self, limit: &Limit, now: UnixMillis) -> u64 {
        match limit.algorithm {
            Algorithm::FixedWindow => self.curr,
            Algorithm::SlidingWindow => {
                let w = limit.window_ms as u128;
                let left = w - (now.0 % limit.window_ms) as u128;
                (self.prev as u128 * left / w) as u64 + self.curr
            }
        }
    }

    /// Checks `hits` at `now` without counting them.
    pub fn check(&mut self, limit: &Limit, now: UnixMillis, hits: u64) -> Verdict {
        self.roll(limit, now);
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
        self.roll(limit, now);
        if admitted || limit.algorithm == Algorithm::FixedWindow {
            self.curr = self.curr.saturating_add(hits);
        }
    }

    /// Gives `hits` back to the current window (Envoy's `is_negative_hits`).
    pub fn refund(&mut self, limit: &Limit, now: UnixMillis, hits: u64) {
        self.roll(limit, now);
        self.curr = self.curr.saturating_sub(hits);
    }

    /// Hits counted in the current epoch (after rolling to `now`).
    pub fn current_count(&mut self, limit: &Limit, now: UnixMillis) -> u64 {
        self.roll(limit, now);
        self.curr
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
}
