//! A shard's health as readiness and metrics report it: whether it has ever answered, whether
//! its last call (or its sync task) failed and why, and since when.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

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
}
