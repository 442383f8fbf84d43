//! Global mode's own settings: where the counters live ([`RedisSettings`], the per-second
//! Redis) and how the sync runs ([`SyncConfig`]), gathered in [`Config`]. The process settings
//! (`settings/`) build them from flags and the environment; nothing here reads either.

use std::time::Duration;

use crate::global::redis::{RedisOptions, SentinelMaster};
pub use crate::global::sync::settings::SyncSettings;

/// Global mode: the Redis (and per-second Redis) the fleet syncs through, and the sync's
/// cadence and bounds. `Settings::global` builds it; [`crate::global::connect`] and
/// [`crate::global::spawn`] take it.
#[derive(Debug, Clone)]
pub struct Config {
    /// The shared Redis.
    pub redis: RedisSettings,
    /// `REDIS_PERSECOND`: a Redis of their own for limits whose unit is second.
    pub per_second: Option<PerSecondRedis>,
    /// How the sync runs.
    pub sync: SyncConfig,
}

impl Config {
    /// Global mode on `redis` (and `per_second`), syncing with `sync`, at most `max_queued`
    /// entities waiting, joining the fleet within `join_timeout` at start.
    pub fn new(
        redis: RedisSettings,
        per_second: Option<PerSecondRedis>,
        sync: SyncSettings,
        max_queued: usize,
        join_timeout: Duration,
    ) -> Self {
        let per_second_timeout = per_second.as_ref().map_or(sync.timeout, |p| p.timeout);
        Config {
            redis,
            per_second,
            sync: SyncConfig {
                per_second_timeout,
                join_timeout,
                ..SyncConfig::new(sync, max_queued)
            },
        }
    }
}

/// How [`crate::global::spawn`] runs the sync, whatever the stores are (Redis, or the
/// simulator's in-memory one).
#[derive(Debug, Clone, Copy)]
pub struct SyncConfig {
    /// Cadence, timeouts and bounds of every shard's task; `settings.timeout` is the main
    /// Redis's call timeout.
    pub settings: SyncSettings,
    /// Most entities waiting to sync (`SYNC_MAX_QUEUED`).
    pub max_queued: usize,
    /// Timeout of one call to a per-second shard (`REDIS_PERSECOND_TIMEOUT`).
    pub per_second_timeout: Duration,
    /// How long the sync tasks wait before their first run: none in production; the
    /// simulator staggers its nodes' ticks as nodes started apart would be.
    pub first_run_after: Duration,
    /// `SYNC_JOIN_TIMEOUT`: how long the start waits for a store to register this replica
    /// in the fleet (`global/join.rs`); zero turns the join off (ready at once, as a fleet
    /// the simulator starts warm, or the benches).
    pub join_timeout: Duration,
}

impl SyncConfig {
    /// `settings` for every shard, at most `max_queued` entities waiting, no wait, no join.
    pub fn new(settings: SyncSettings, max_queued: usize) -> Self {
        SyncConfig {
            settings,
            max_queued,
            per_second_timeout: settings.timeout,
            first_run_after: Duration::ZERO,
            join_timeout: Duration::ZERO,
        }
    }
}

/// Where global mode keeps the fleet's counters.
#[derive(Clone)]
pub struct RedisSettings {
    /// Normalized URLs (credentials included: never log them; use `redis::redact`).
    pub urls: Vec<String>,
    /// A Redis Cluster (the URLs are seeds) rather than standalone shards.
    pub cluster: bool,
    /// Sentinel (`REDIS_TYPE=SENTINEL`): the URLs are the sentinels, with their own
    /// credentials (`REDIS_SENTINEL_AUTH`), and this is the master they name.
    pub sentinel: Option<SentinelMaster>,
    /// Auth, prefix, pool size.
    pub options: RedisOptions,
}

/// `REDIS_PERSECOND`: where the counters of limits whose unit is second go instead.
#[derive(Debug, Clone)]
pub struct PerSecondRedis {
    /// The per-second Redis (`REDIS_PERSECOND_URL`, `_TYPE`, `_AUTH`, ...).
    pub redis: RedisSettings,
    /// Timeout of one call to it (`REDIS_PERSECOND_TIMEOUT`, else `REDIS_TIMEOUT`).
    pub timeout: Duration,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self
            .urls
            .iter()
            .map(|u| crate::global::redis::redact(u))
            .collect();
        f.debug_struct("RedisSettings")
            .field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("sentinel", &self.sentinel)
            .field("options", &self.options)
            .finish()
    }
}
