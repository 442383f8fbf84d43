//! A shard's health as readiness and metrics report it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::store::StoreError;
use crate::core::clock::UnixMillis;

/// A shard's health, for readiness details and metrics.
#[derive(Debug)]
pub struct ShardHealth {
    /// The shard's name.
    pub name: String,
    degraded: AtomicBool,
    last_error: Mutex<Option<String>>,
    last_success_ms: AtomicU64,
}

impl ShardHealth {
    /// A healthy shard named `name`.
    pub fn new(name: String) -> Self {
        ShardHealth {
            name,
            degraded: AtomicBool::new(false),
            last_error: Mutex::new(None),
            last_success_ms: AtomicU64::new(0),
        }
    }

    /// Whether the last call failed.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// The last error, while degraded.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// When the last call succeeded (Unix ms; 0: never).
    pub fn last_success_ms(&self) -> u64 {
        self.last_success_ms.load(Ordering::Relaxed)
    }

    pub(super) fn ok(&self, now: UnixMillis) {
        self.degraded.store(false, Ordering::Relaxed);
        *self.last_error.lock() = None;
        self.last_success_ms.store(now.0, Ordering::Relaxed);
    }

    pub(super) fn failed(&self, e: &StoreError) {
        if !self.degraded.swap(true, Ordering::Relaxed) {
            tracing::warn!(shard = %self.name, error = %e, "store shard degraded; deciding locally, keeping deltas");
        }
        *self.last_error.lock() = Some(e.to_string());
    }
}
