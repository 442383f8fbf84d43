//! How the shard tasks run ([`SyncSettings`]): the tick, the store call's timeout and the
//! backoff after a failure. Here, with the sync, rather than in `global/config.rs`, which
//! names the Redis settings: so the sync's code names nothing of Redis's, even through it.

use std::time::Duration;

use crate::core::tier::SyncPolicy;

/// How the shard tasks run.
#[derive(Debug, Clone, Copy)]
pub struct SyncSettings {
    /// Tick and tier cadence.
    pub policy: SyncPolicy,
    /// Timeout of one store call.
    pub timeout: Duration,
    /// First backoff after a failure; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
    /// The most entries a shard's reset log keeps (`RESET_LOG_LENGTH`, `reset_log.rs`).
    pub reset_log_length: usize,
}

impl SyncSettings {
    /// How long a heartbeat lasts unrefreshed: three ticks, plus the longest backoff of a
    /// replica whose calls fail (it is still there, and its hits will arrive).
    pub fn heartbeat_ttl_ms(&self) -> u64 {
        3 * self.policy.tick_ms + self.backoff_max.as_millis() as u64
    }
}

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            policy: SyncPolicy::default(),
            timeout: Duration::from_millis(100),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            reset_log_length: super::reset_log::DEFAULT_RESET_LOG_LENGTH,
        }
    }
}
