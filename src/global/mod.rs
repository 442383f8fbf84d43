//! Starting global mode: the Redis stores, one sync task per shard, the clock-offset task and
//! the sync metrics. `lib::run` calls [`start`] and, at shutdown, waits for [`Global::join`]
//! (the tasks' final flush).

pub mod clock_offset;
pub mod health;
pub mod memory;
pub mod queue;
pub mod redis;
pub mod shard;
pub mod store;

pub use clock_offset::measure_offset;
pub use health::ShardHealth;
pub use queue::{ShardRouter, SyncQueues, SyncStats};
pub use shard::{ShardSync, SyncSettings};
pub use store::{ShardStore, StoreError, SyncItem};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::redis::{RedisClusterStore, RedisShard};
use crate::settings::{RedisSettings, Settings};
use crate::telemetry::Telemetry;

/// How often the clock offset from Redis is measured again.
const OFFSET_EVERY: Duration = Duration::from_secs(30);

/// Running global mode.
pub struct Global {
    /// Where the hot path queues entities.
    pub queues: Arc<SyncQueues>,
    /// Each shard's health.
    pub health: Vec<Arc<ShardHealth>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Global {
    /// Waits for every task (after the stop token: their final flush).
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Builds the stores and starts the tasks; they stop (after a final flush) on `stop`.
///
/// # Errors
/// When a Redis URL is unusable. An unreachable Redis is not an error: its shard starts
/// degraded and recovers when Redis answers.
pub async fn start(
    redis: &RedisSettings,
    settings: &Settings,
    clock: Arc<dyn Clock>,
    telemetry: &Telemetry,
    stop: CancellationToken,
) -> Result<Global, String> {
    crate::global::redis::init_tls();
    let g = if redis.cluster {
        let store = RedisClusterStore::new(&redis.urls, &redis.options)?;
        spawn(vec![store], settings, clock, stop).await
    } else {
        let stores = redis
            .urls
            .iter()
            .map(|u| RedisShard::new(u, &redis.options))
            .collect::<Result<Vec<_>, _>>()?;
        spawn(stores, settings, clock, stop).await
    };
    register_metrics(telemetry, &g);
    Ok(g)
}

async fn spawn<S: ShardStore>(
    stores: Vec<S>,
    settings: &Settings,
    clock: Arc<dyn Clock>,
    stop: CancellationToken,
) -> Global {
    let names: Vec<String> = stores.iter().map(|s| s.name().to_string()).collect();
    let queues = Arc::new(SyncQueues::new(
        ShardRouter::new(&names),
        stores.len(),
        settings.sync_max_queued,
    ));
    let stores: Vec<Arc<S>> = stores.into_iter().map(Arc::new).collect();
    // Correct the clock before the first decision, so this node's epochs match the fleet's.
    adjust_clock(&*stores[0], &*clock, settings.sync.timeout * 10).await;
    let mut tasks = Vec::new();
    let mut health = Vec::new();
    for (index, store) in stores.iter().enumerate() {
        let h = Arc::new(ShardHealth::new(store.name().to_string()));
        health.push(h.clone());
        let task = ShardSync {
            index,
            store: store.clone(),
            queues: queues.clone(),
            health: h,
            clock: clock.clone(),
            settings: settings.sync,
        };
        tasks.push(tokio::spawn(task.run(stop.clone())));
    }
    let (store, timeout) = (stores[0].clone(), settings.sync.timeout * 10);
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(OFFSET_EVERY) => adjust_clock(&*store, &*clock, timeout).await,
            }
        }
    }));
    tracing::info!(shards = ?names, "global mode: syncing through Redis");
    Global {
        queues,
        health,
        tasks,
    }
}

async fn adjust_clock<S: ShardStore>(store: &S, clock: &dyn Clock, timeout: Duration) {
    match measure_offset(store, clock, timeout).await {
        Ok(off) => {
            if (off - clock.offset_ms()).abs() > 50 {
                tracing::info!(offset_ms = off, "clock offset from Redis TIME applied");
            }
            clock.set_offset_ms(off);
        }
        Err(e) => tracing::warn!(error = %e, "cannot read Redis TIME; keeping the clock offset"),
    }
}

fn register_metrics(t: &Telemetry, g: &Global) {
    let s = g.queues.stats.clone();
    type Pick = fn(&crate::global::SyncStats) -> u64;
    let counters: [(&'static str, &'static str, Pick); 8] = [
        ("sluice_sync_ticks_total", "Sync ticks, all shards", |s| {
            s.ticks.load(Ordering::Relaxed)
        }),
        (
            "sluice_sync_items_total",
            "Entity limits sent in syncs",
            |s| s.items_sent.load(Ordering::Relaxed),
        ),
        (
            "sluice_redis_commands_total",
            "Commands sent to Redis by syncs",
            |s| s.commands_sent.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_deltas_dropped_total",
            "Hits that could not be kept for sync",
            |s| s.deltas_dropped.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_tier_transitions_total",
            "Entities whose pressure tier changed at a sync",
            |s| s.tier_transitions.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_estimate_drift_hits_total",
            "Sum of |estimate after a sync - before|, in hits",
            |s| s.drift_hits.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_call_seconds_total",
            "Time spent in Redis sync calls (microseconds / 1e6)",
            |s| s.call_micros.load(Ordering::Relaxed) / 1_000_000,
        ),
        (
            "sluice_redis_errors_total",
            "Failed Redis sync calls",
            |s| s.calls_failed.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, pick) in counters {
        let s = s.clone();
        t.counter(name, help, Arc::new(move || vec![(pick(&s), vec![])]));
    }
    let s2 = s.clone();
    t.counter(
        "sluice_sync_calls_total",
        "Redis sync calls, by result",
        Arc::new(move || {
            vec![
                (
                    s2.calls_ok.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "ok")],
                ),
                (
                    s2.calls_failed.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "error")],
                ),
            ]
        }),
    );
    let s3 = s.clone();
    t.counter(
        "sluice_sync_entities_total",
        "Entity limits synced, by pressure tier at the sync",
        Arc::new(move || {
            ["idle", "low", "normal", "hot"]
                .iter()
                .zip(&s3.synced_by_tier)
                .map(|(tier, n)| {
                    (
                        n.load(Ordering::Relaxed),
                        vec![KeyValue::new("tier", *tier)],
                    )
                })
                .collect()
        }),
    );
    let q = g.queues.clone();
    t.gauge(
        "sluice_sync_pending_entities",
        "Entities waiting to sync",
        Arc::new(move || q.len() as u64),
    );
    type PerShard = fn(&ShardHealth) -> u64;
    let per_shard: [(&'static str, &'static str, PerShard); 2] = [
        (
            "sluice_redis_shard_degraded",
            "1 while a Redis shard's last call failed",
            |h| u64::from(h.is_degraded()),
        ),
        (
            "sluice_redis_last_sync_unix_seconds",
            "When a shard's last sync succeeded (staleness = now - this)",
            |h| h.last_success_ms() / 1000,
        ),
    ];
    for (name, help, read) in per_shard {
        let health = g.health.clone();
        t.labelled_gauge(
            name,
            help,
            Arc::new(move || {
                health
                    .iter()
                    .map(|h| (read(h), vec![KeyValue::new("shard", h.name.clone())]))
                    .collect()
            }),
        );
    }
}
