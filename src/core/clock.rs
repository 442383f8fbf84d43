//! Time for the decision core: the `Clock` trait, the system clock and a manual clock for tests.
//!
//! This is the only file that reads the wall clock (`.clippy.toml` bans it elsewhere), so every
//! decision can be replayed with a [`ManualClock`]. Time is Unix milliseconds because windows are
//! aligned to the Unix epoch, which lets every replica agree on window boundaries.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// Builds a timestamp from whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        UnixMillis(secs * 1000)
    }

    /// This time shifted forward by `ms` milliseconds.
    pub const fn plus_millis(self, ms: u64) -> Self {
        UnixMillis(self.0 + ms)
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> UnixMillis;

    /// The correction this clock adds to its source (0 for clocks that take none).
    fn offset_ms(&self) -> i64 {
        0
    }

    /// Sets the correction (ignored by clocks that take none).
    fn set_offset_ms(&self, _offset: i64) {}
}

/// The process's wall clock, optionally corrected by an offset (measured against a shared
/// reference such as Redis `TIME`, so replicas with skewed clocks still share windows).
#[derive(Debug, Clone, Default)]
pub struct SystemClock {
    offset_ms: Arc<AtomicI64>,
    /// A fixed error added to the wall clock, to test offset correction (0 in production).
    skew_ms: i64,
}

impl SystemClock {
    /// A clock with no offset.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock whose source is off by `skew_ms`, as a badly set machine's would be.
    pub fn skewed(skew_ms: i64) -> Self {
        SystemClock {
            skew_ms,
            ..Self::default()
        }
    }
}

impl Clock for SystemClock {
    fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    fn set_offset_ms(&self, offset: i64) {
        self.offset_ms.store(offset, Ordering::Relaxed);
    }

    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    fn now(&self) -> UnixMillis {
        let local = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        UnixMillis(
            local
                .saturating_add(self.skew_ms)
                .saturating_add(self.offset_ms())
                .max(0) as u64,
        )
    }
}

/// A clock that moves only when told to. Clones share one time (as in governor's fake clock),
/// so a test can hold one handle while the service holds another.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: UnixMillis) -> Self {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: UnixMillis) {
        self.now_ms.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMillis {
        UnixMillis(self.now_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(UnixMillis::from_secs(10));
        let b = a.clone();
        a.advance_ms(1500);
        assert_eq!(b.now(), UnixMillis(11_500));
    }

    #[test]
    fn system_clock_applies_offset() {
        let c = SystemClock::new();
        let before = c.now();
        c.set_offset_ms(3_600_000);
        assert!(c.now().0 >= before.0 + 3_600_000);
    }
}
