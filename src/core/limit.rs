//! The limit vocabulary: what a limit is ([`Limit`], [`Algorithm`]), what checking hits
//! against one says ([`Verdict`]), the most a counter holds ([`MAX_COUNT`]), and the verdict
//! on a count known already ([`verdict_on`]). It uses only the clock: every counter and every
//! caller speaks it.

use super::clock::UnixMillis;

/// How a limit counts hits over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// The 2-epoch sliding window counter (the default).
    #[default]
    SlidingWindow,
    /// Windows aligned to the epoch, reset at each boundary (envoyproxy/ratelimit's behaviour).
    FixedWindow,
    /// A token bucket of `burst` tokens refilled at `requests_per_unit` per window
    /// (`bucket.rs`).
    TokenBucket {
        /// The capacity, in tokens.
        burst: u32,
    },
    /// At most `requests_per_unit` acquisitions in flight: a hit acquires, a refund
    /// (`is_negative_hits`) releases, and an acquisition never released lapses one to two
    /// windows (its *lease*) after it was made (`window/mod.rs`).
    Concurrency,
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

impl Limit {
    /// The most a limit admits at once: a bucket's burst, a window's `requests_per_unit`.
    pub fn capacity(&self) -> u32 {
        match self.algorithm {
            Algorithm::TokenBucket { burst } => burst,
            _ => self.requests_per_unit,
        }
    }
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
    /// Milliseconds until the current window ends (1..=W); for a bucket, until it is full
    /// again (0: full).
    pub reset_ms: u64,
    /// When over: milliseconds until the same request could be admitted (`Retry-After`): the
    /// window's end, or the time a bucket takes to hold the tokens. 0 when admitted.
    pub retry_ms: u64,
}

/// The most a counter holds: hits past it are not counted (see the module docs).
pub const MAX_COUNT: u64 = (1 << 53) - 1;

/// The verdict of `hits` on top of a window count `count` (see [`window_count`]): the same
/// rule as [`WindowState::check`] in local mode.
pub fn verdict_on(limit: &Limit, now: UnixMillis, count: u64, hits: u64) -> Verdict {
    let count_after = count.saturating_add(hits);
    let rpu = u64::from(limit.requests_per_unit);
    let over = rpu == 0 || count_after > rpu;
    let reset_ms = limit.window_ms - now.0 % limit.window_ms;
    Verdict {
        count_after,
        over,
        remaining: if over { 0 } else { (rpu - count_after) as u32 },
        reset_ms,
        retry_ms: if over { reset_ms } else { 0 },
    }
}
