//! How many items one sync call of a shard carries: sized by how fast the shard answers, so
//! that a call finishes well within its timeout whatever the backlog.
//!
//! A fixed size is wrong both ways. A Redis runs the sync script at some microseconds an
//! item (more on a busy or small instance), so a call of 20,000 items, the old fixed bound,
//! took past the 100 ms timeout: a flood of a million new values made every call time out,
//! the shard flapped between degraded and recovered, and nothing drained (1,000,000 entities
//! still pending 10 s after the flood, `benches/sync_backlog.sh`). A small fixed size
//! drains a backlog a round trip at a time. So the size follows the answers: it doubles
//! after a full call that took under a quarter of the timeout, shrinks by a quarter after
//! one that took over half of it, and halves after a timeout, which is then put down to
//! the size (the call is resent smaller at once, and the shard is not marked degraded)
//! while the call carried more than [`MIN_BATCH`] items. A call of at most that many that
//! times out is a failing store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The least a call's size shrinks to: one script call's chunk (`global/redis/sync.rs`).
pub const MIN_BATCH: usize = 500;

/// The most items in one call, however fast the shard answers.
pub const MAX_BATCH: usize = 20_000;

/// The size a shard's calls start at: a few chunks, small enough for a slow Redis's first
/// call, and four doublings from the most.
const START_BATCH: usize = 4 * MIN_BATCH;

/// A shard's current call size, between [`MIN_BATCH`] and [`MAX_BATCH`].
#[derive(Debug)]
pub struct BatchSize(AtomicUsize);

impl Default for BatchSize {
    fn default() -> Self {
        BatchSize(AtomicUsize::new(START_BATCH))
    }
}

impl BatchSize {
    /// The most items the next call carries.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// After a call of `items` answered in `took`: a full call (`items` at the size) well
    /// within `timeout` doubles it; a slow one shrinks it by a quarter.
    pub fn answered(&self, items: usize, took: Duration, timeout: Duration) {
        let size = self.get();
        let next = if took > timeout / 2 {
            size - size / 4
        } else if items >= size && took < timeout / 4 {
            size * 2
        } else {
            size
        };
        self.set(next);
    }

    /// After a call of `items` timed out: whether the size is to blame (it carried more
    /// than [`MIN_BATCH`]), in which case the size is halved below what it carried.
    pub fn timed_out(&self, items: usize) -> bool {
        if items <= MIN_BATCH {
            return false;
        }
        self.set(items / 2);
        true
    }

    fn set(&self, size: usize) {
        self.0
            .store(size.clamp(MIN_BATCH, MAX_BATCH), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(100);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_fast_full_call_doubles_the_size_up_to_the_most() {
        let b = BatchSize::default();
        b.answered(START_BATCH, 10 * MS, TIMEOUT);
        assert_eq!(b.get(), 2 * START_BATCH);
        // A call that was not full says nothing about a larger one.
        b.answered(10, MS, TIMEOUT);
        assert_eq!(b.get(), 2 * START_BATCH);
        for _ in 0..10 {
            b.answered(b.get(), MS, TIMEOUT);
        }
        assert_eq!(b.get(), MAX_BATCH);
    }

    #[test]
    fn a_slow_call_shrinks_it_and_one_in_between_keeps_it() {
        let b = BatchSize::default();
        b.answered(START_BATCH, 40 * MS, TIMEOUT);
        assert_eq!(b.get(), START_BATCH);
        b.answered(START_BATCH, 60 * MS, TIMEOUT);
        assert_eq!(b.get(), START_BATCH * 3 / 4);
        for _ in 0..20 {
            b.answered(b.get(), 90 * MS, TIMEOUT);
        }
        assert_eq!(b.get(), MIN_BATCH);
    }

    #[test]
    fn a_timeout_is_put_down_to_the_size_only_above_the_least() {
        let b = BatchSize::default();
        assert!(b.timed_out(START_BATCH));
        assert_eq!(b.get(), START_BATCH / 2);
        assert!(b.timed_out(b.get()));
        assert_eq!(b.get(), MIN_BATCH);
        // A call of the least size that times out is the store failing.
        assert!(!b.timed_out(MIN_BATCH));
        assert_eq!(b.get(), MIN_BATCH);
        // A small call (a quiet shard) timing out says nothing about the size either.
        assert!(!b.timed_out(3));
    }
}
