//! A shard's health as readiness and metrics report it: whether it has ever answered, whether
//! its last call (or its sync task) failed and why, and since when; and how often the store
//! was found to have lost the sync's keys (its generation changed, `store.rs`); the size
//! of call it answers in time (`batch.rs`); and its place in its reset log (`reset_log.rs`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::batch::BatchSize;
use super::reset_log::ResetCursor;
use crate::core::clock::UnixMillis;

/// What readiness says about a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardStatus {
    /// No call has finished yet: its health is unknown, so it is not called ok.
    NotAnsweredYet,
    /// The last call succeeded.
    Ok,
    /// The last call failed, or its sync task stopped.
    Degraded {
        /// Why.
        reason: String,
        /// Whether the shard ever answered since start.
        answered: bool,
    },
}

impl fmt::Display for ShardStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardStatus::NotAnsweredYet => f.write_str("not answered yet"),
            ShardStatus::Ok => f.write_str("ok"),
            ShardStatus::Degraded {
                reason,
                answered: true,
            } => write!(f, "degraded: {reason}"),
            ShardStatus::Degraded {
                reason,
                answered: false,
            } => write!(f, "degraded, not answered yet: {reason}"),
        }
    }
}

/// A shard's health, for readiness details and metrics.
#[derive(Debug)]
pub struct ShardHealth {
    /// The shard's name.
    pub name: String,
    answered: AtomicBool,
    degraded: AtomicBool,
    /// Why it is degraded; also the lock that orders the state changes, so a reader never
    /// sees a degraded flag without its reason.
    reason: Mutex<Option<String>>,
    degraded_since_ms: AtomicU64,
    last_success_ms: AtomicU64,
    /// The store's generation as the heartbeats last read it: none until the first.
    generation: Mutex<Option<u64>>,
    resets: AtomicU64,
    last_reset_ms: AtomicU64,
    /// How many items its next call carries.
    pub batch: BatchSize,
    /// Its place in its reset log (`reset_log.rs`).
    pub reset_log: ResetCursor,
}

impl ShardHealth {
    /// A shard named `name` that has not answered yet.
    pub fn new(name: String) -> Self {
        ShardHealth {
            name,
            answered: AtomicBool::new(false),
            degraded: AtomicBool::new(false),
            reason: Mutex::new(None),
            degraded_since_ms: AtomicU64::new(0),
            last_success_ms: AtomicU64::new(0),
            generation: Mutex::new(None),
            resets: AtomicU64::new(0),
            last_reset_ms: AtomicU64::new(0),
            batch: BatchSize::default(),
            reset_log: ResetCursor::default(),
        }
    }

    /// What readiness reports.
    pub fn status(&self) -> ShardStatus {
        let reason = self.reason.lock();
        match (&*reason, self.answered.load(Ordering::Relaxed)) {
            (Some(reason), answered) => ShardStatus::Degraded {
                reason: reason.clone(),
                answered,
            },
            (None, true) => ShardStatus::Ok,
            (None, false) => ShardStatus::NotAnsweredYet,
        }
    }

    /// Whether the last call failed (or the sync task stopped).
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Whether the shard has answered at least once since start.
    pub fn has_answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// Why the shard is degraded, while it is.
    pub fn last_error(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// When the last call succeeded (Unix ms; 0: never).
    pub fn last_success_ms(&self) -> u64 {
        self.last_success_ms.load(Ordering::Relaxed)
    }

    /// How many times the store was found to have lost the sync's keys since start.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// What readiness adds to the status once the store lost the sync's keys: how often, and
    /// when last.
    pub fn resets_note(&self) -> Option<String> {
        let n = self.resets();
        (n > 0).then(|| {
            let ms = self.last_reset_ms.load(Ordering::Relaxed);
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            format!(
                "lost the sync's keys {n} time(s) since start, last at {}",
                humantime::format_rfc3339_seconds(at)
            )
        })
    }

    /// Takes in the store's generation as a heartbeat read it at `now`. Another one than the
    /// last read means the store lost the sync's keys in between: counted and logged. The
    /// first read is only remembered: a replica that never read one cannot tell a store that
    /// lost it from a fleet's first start, which writes it.
    pub(in crate::global) fn observe_generation(&self, generation: u64, now: UnixMillis) {
        let before = self.generation.lock().replace(generation);
        if before.is_some_and(|b| b != generation) {
            self.reset_log.store_lost();
            let n = self.resets.fetch_add(1, Ordering::Relaxed) + 1;
            self.last_reset_ms.store(now.0, Ordering::Relaxed);
            tracing::warn!(
                shard = %self.name,
                resets = n,
                "store shard lost the sync's keys (restarted empty, flushed or replaced); \
                 restoring the counts from the replicas' memory"
            );
        }
    }

    /// Records an answer at `now`; logs the recovery of a degraded shard with how long it was
    /// degraded.
    pub(in crate::global) fn ok(&self, now: UnixMillis) {
        let mut reason = self.reason.lock();
        let was = reason.take();
        self.answered.store(true, Ordering::Relaxed);
        self.last_success_ms.store(now.0, Ordering::Relaxed);
        if self.degraded.swap(false, Ordering::Relaxed) {
            let since = self.degraded_since_ms.load(Ordering::Relaxed);
            let degraded_for = std::time::Duration::from_millis(now.0.saturating_sub(since));
            tracing::info!(
                shard = %self.name,
                degraded_for = %humantime::format_duration(degraded_for),
                last_error = was.as_deref().unwrap_or(""),
                "store shard recovered; syncing again"
            );
        }
    }

    /// Records a failure at `now` (a store error, or the sync task stopping).
    pub(in crate::global) fn failed(&self, why: &dyn fmt::Display, now: UnixMillis) {
        let mut reason = self.reason.lock();
        if !self.degraded.swap(true, Ordering::Relaxed) {
            self.degraded_since_ms.store(now.0, Ordering::Relaxed);
            tracing::warn!(shard = %self.name, error = %why, "store shard degraded; deciding locally, keeping deltas");
        }
        *reason = Some(why.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_not_ok_before_it_answers() {
        let h = ShardHealth::new("r".into());
        assert_eq!(h.status(), ShardStatus::NotAnsweredYet);
        assert_eq!(h.status().to_string(), "not answered yet");
        h.failed(&"connection refused", UnixMillis(1_000));
        assert_eq!(
            h.status().to_string(),
            "degraded, not answered yet: connection refused"
        );
        h.ok(UnixMillis(5_000));
        assert_eq!(h.status(), ShardStatus::Ok);
        h.failed(&"timed out", UnixMillis(6_000));
        assert_eq!(h.status().to_string(), "degraded: timed out");
        assert!(h.is_degraded() && h.has_answered());
    }

    #[test]
    fn only_a_generation_that_changed_counts_as_lost_keys() {
        let h = ShardHealth::new("r".into());
        // The first read (a fleet's first start wrote it, or this replica is new) and the same
        // one again: nothing lost.
        h.observe_generation(7, UnixMillis(1_000));
        h.observe_generation(7, UnixMillis(2_000));
        assert_eq!((h.resets(), h.resets_note()), (0, None));
        h.observe_generation(9, UnixMillis(1_700_000_000_000));
        h.observe_generation(9, UnixMillis(1_700_000_001_000));
        assert_eq!(h.resets(), 1);
        assert_eq!(
            h.resets_note().unwrap(),
            "lost the sync's keys 1 time(s) since start, last at 2023-11-14T22:13:20Z"
        );
        h.observe_generation(7, UnixMillis(1_700_000_002_000));
        assert_eq!(h.resets(), 2);
    }
}
