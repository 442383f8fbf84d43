//! Starting global mode: the Redis stores, one sync task per shard, the clock-offset task and
//! the sync metrics. `lib::run` calls [`start`] and, at shutdown, waits for [`Global::join`]
//! (the tasks' final flush).
//!
//! Every task runs under `supervise`: one that panics or ends before shutdown is logged,
//! counted, marks its shard degraded with the reason, and is restarted with backoff.

pub mod exact;
pub mod redis;
pub mod sync;

pub use exact::{ExactClient, ExactItem, ExactStore};
pub use sync::{
    measure_offset, new_replica_id, Heartbeat, ShardHealth, ShardRouter, ShardStore, ShardSync,
    StoreError, SyncItem, SyncOp, SyncQueues, SyncSettings, SyncStats,
};

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::redis::RedisStore;
use crate::settings::{RedisSettings, Settings};
use crate::telemetry::Telemetry;

/// How often the clock offset from Redis is measured again.
const OFFSET_EVERY: Duration = Duration::from_secs(30);

/// First wait before restarting a stopped task, doubling up to the most; a task that ran
/// longer than the most before stopping starts again from the first.
const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(500);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Running global mode.
pub struct Global {
    /// Where the hot path queues entities.
    pub queues: Arc<SyncQueues>,
    /// Each shard's health.
    pub health: Vec<Arc<ShardHealth>>,
    /// Exact rules' way to Redis (set by [`start`]), for the limiter to take.
    pub exact: Option<ExactClient>,
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
    let stores =
        |r: &RedisSettings| RedisStore::all(&r.urls, r.cluster, r.sentinel.as_ref(), &r.options);
    let main = stores(redis)?;
    let per_second = match &settings.redis_per_second {
        Some(p) => PerSecondStores {
            stores: stores(&p.redis)?,
            timeout: p.timeout,
        },
        None => PerSecondStores {
            stores: Vec::new(),
            timeout: settings.sync.timeout,
        },
    };
    let mut g = spawn(main, per_second, settings, clock, stop).await;
    g.exact = Some(exact_client(redis, settings)?);
    register_metrics(telemetry, &g);
    Ok(g)
}

/// The per-second group of stores (`REDIS_PERSECOND`; empty without) and its call timeout.
struct PerSecondStores<S> {
    stores: Vec<S>,
    timeout: Duration,
}

/// Exact stores and the names that route to them.
type ExactStores = (Vec<Arc<dyn ExactStore>>, Vec<String>);

/// The exact stores of one Redis setting (pools of their own) and their routing names: the
/// sync's shards'.
fn exact_stores(redis: &RedisSettings) -> Result<ExactStores, String> {
    use crate::global::exact::redis::RedisExact;
    let all = RedisExact::all(
        &redis.urls,
        redis.cluster,
        redis.sentinel.as_ref(),
        &redis.options,
    )?;
    Ok(all
        .into_iter()
        .map(|(name, store)| (Arc::new(store) as Arc<dyn ExactStore>, name))
        .unzip())
}

/// The exact rules' client: stores of their own (pools apart from the sync's), routed as the
/// sync routes entities (per-second rules to the per-second Redis), bounded by the Redis
/// timeout (the longer of the two with a per-second Redis: one request may call both).
fn exact_client(redis: &RedisSettings, settings: &Settings) -> Result<ExactClient, String> {
    let (mut stores, main_names) = exact_stores(redis)?;
    let mut timeout = settings.sync.timeout;
    let ps_names = match &settings.redis_per_second {
        Some(p) => {
            let (more, names) = exact_stores(&p.redis)?;
            stores.extend(more);
            timeout = timeout.max(p.timeout);
            names
        }
        None => Vec::new(),
    };
    Ok(ExactClient::new(
        stores,
        ShardRouter::with_per_second(&main_names, &ps_names),
        timeout,
    ))
}

async fn spawn<S: ShardStore>(
    stores: Vec<S>,
    per_second: PerSecondStores<S>,
    settings: &Settings,
    clock: Arc<dyn Clock>,
    stop: CancellationToken,
) -> Global {
    let main_names: Vec<String> = stores.iter().map(|s| s.name().to_string()).collect();
    let ps_names: Vec<String> = per_second
        .stores
        .iter()
        .map(|s| s.name().to_string())
        .collect();
    let names: Vec<String> = main_names.iter().chain(&ps_names).cloned().collect();
    let queues = Arc::new(SyncQueues::new(
        ShardRouter::with_per_second(&main_names, &ps_names),
        names.len(),
        settings.sync_max_queued,
    ));
    let main_count = stores.len();
    let stores: Vec<Arc<S>> = stores
        .into_iter()
        .chain(per_second.stores)
        .map(Arc::new)
        .collect();
    // Correct the clock before the first decision, so this node's epochs match the fleet's.
    adjust_clock(&*stores[0], &*clock, settings.sync.timeout * 10).await;
    tracing::debug!(
        replica = format!("{:016x}", queues.replica_id()),
        "replica id"
    );
    let mut tasks = Vec::new();
    let mut health = Vec::new();
    for (index, store) in stores.iter().enumerate() {
        let h = Arc::new(ShardHealth::new(store.name().to_string()));
        health.push(h.clone());
        let mut sync = settings.sync;
        if index >= main_count {
            sync.timeout = per_second.timeout;
        }
        let task = ShardSync {
            index,
            store: store.clone(),
            queues: queues.clone(),
            health: h.clone(),
            clock: clock.clone(),
            settings: sync,
        };
        let watch = Watch {
            task: "sync task",
            shard: Some(h),
            clock: clock.clone(),
            stats: queues.stats.clone(),
            stop: stop.clone(),
        };
        let stop = stop.clone();
        tasks.push(tokio::spawn(supervise(watch, move || {
            task.clone().run(stop.clone())
        })));
    }
    let (store, timeout) = (stores[0].clone(), settings.sync.timeout * 10);
    let watch = Watch {
        task: "clock-offset task",
        shard: None,
        clock: clock.clone(),
        stats: queues.stats.clone(),
        stop: stop.clone(),
    };
    tasks.push(tokio::spawn(supervise(watch, move || {
        let (store, clock, stop) = (store.clone(), clock.clone(), stop.clone());
        async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(OFFSET_EVERY) => adjust_clock(&*store, &*clock, timeout).await,
                }
            }
        }
    })));
    tracing::info!(shards = ?main_names, per_second = ?ps_names, "global mode: syncing through Redis");
    Global {
        queues,
        health,
        exact: None,
        tasks,
    }
}

/// What [`supervise`] watches and where it reports.
struct Watch {
    /// The task, for logs and the degraded reason ("sync task", "clock-offset task").
    task: &'static str,
    /// The shard the task serves, marked degraded while it is down.
    shard: Option<Arc<ShardHealth>>,
    clock: Arc<dyn Clock>,
    /// Where stopped tasks are counted (`task_failures`).
    stats: Arc<SyncStats>,
    /// Shutdown: the only time a task may end.
    stop: CancellationToken,
}

/// Runs the task `start` makes until it ends after `stop`. One that panics or returns before
/// `stop` is logged, counted, marks its shard degraded, and is started again after a backoff.
///
/// Restarting rather than exiting the process: a sync task's state lives outside it (the
/// queues, and entities whose unsettled deltas the task's in-flight guard puts back when it
/// unwinds), so a new task picks up where the old one stopped, while the process keeps
/// answering from memory as it does when Redis is down; exiting would drop every node's
/// unsynced hits and every open Envoy connection over what may be one bad reply. If `stop`
/// comes during the backoff the task is still started once, to make its final flush.
async fn supervise<F, Fut>(w: Watch, start: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let shard = w.shard.as_ref().map(|h| h.name.clone()).unwrap_or_default();
    let mut backoff = RESTART_BACKOFF_MIN;
    loop {
        let started = tokio::time::Instant::now();
        let why = match tokio::spawn(start()).await {
            Ok(()) if w.stop.is_cancelled() => return,
            Ok(()) => "ended unexpectedly".to_string(),
            Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e.into_panic())),
            Err(e) => e.to_string(),
        };
        let reason = format!("{} stopped: {why}", w.task);
        w.stats.task_failures.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = &w.shard {
            h.failed(&reason, w.clock.now());
        }
        if w.stop.is_cancelled() {
            tracing::error!(shard = %shard, error = %reason, "stopped during shutdown; not restarted, its unsent hits are lost");
            return;
        }
        if started.elapsed() > RESTART_BACKOFF_MAX {
            backoff = RESTART_BACKOFF_MIN;
        }
        tracing::error!(shard = %shard, error = %reason, restart_in = ?backoff, "background task stopped; restarting it");
        tokio::select! {
            _ = w.stop.cancelled() => {}
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// The message of a panic payload (a `&str` or a `String` for `panic!` with a message).
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_string(), |s| (*s).to_string()),
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
    let counters: [crate::telemetry::CounterRow<SyncStats>; 9] = [
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
            "sluice_sync_task_failures_total",
            "Sync and clock-offset tasks that panicked or ended before shutdown (each restarted)",
            |s| s.task_failures.load(Ordering::Relaxed),
        ),
        (
            "sluice_redis_errors_total",
            "Failed Redis sync calls",
            |s| s.calls_failed.load(Ordering::Relaxed),
        ),
    ];
    t.counter_table(&s, &counters);
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
    register_shard_gauges(t, g);
}

/// Gauges of the queues and of each shard's health.
fn register_shard_gauges(t: &Telemetry, g: &Global) {
    let q = g.queues.clone();
    t.gauge(
        "sluice_sync_pending_entities",
        "Entities waiting to sync",
        Arc::new(move || q.len() as u64),
    );
    let q = g.queues.clone();
    t.gauge(
        "sluice_sync_live_replicas",
        "Live replicas (this one included) as the Redis heartbeats last counted them",
        Arc::new(move || u64::from(q.live_replicas())),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::{ManualClock, UnixMillis};
    use crate::core::table::{CacheSettings, EntityTable};
    use crate::core::{Algorithm, Limit};
    use crate::global::sync::health::ShardStatus;
    use crate::global::sync::memory::MemoryStore;
    use std::sync::atomic::AtomicBool;

    const T0: u64 = 1_700_000_040_000;

    /// A store whose first sync call panics (a bug in a reply's handling, say); then works.
    #[derive(Default)]
    struct PanicsOnce {
        inner: MemoryStore,
        panicked: AtomicBool,
    }

    impl ShardStore for PanicsOnce {
        fn name(&self) -> &str {
            "panics-once"
        }
        async fn sync(
            &self,
            replica: u64,
            items: &[SyncItem],
        ) -> Result<Vec<[u64; 2]>, StoreError> {
            if !self.panicked.swap(true, Ordering::Relaxed) {
                panic!("boom");
            }
            self.inner.sync(replica, items).await
        }
        async fn heartbeat(&self, beat: &Heartbeat) -> Result<u32, StoreError> {
            self.inner.heartbeat(beat).await
        }
        async fn time_ms(&self) -> Result<u64, StoreError> {
            self.inner.time_ms().await
        }
    }

    /// Polls `cond` in (paused, auto-advancing) tokio time, up to a bound.
    async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..10_000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never: {what}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_task_that_panics_is_reported_and_restarted_with_its_hits() {
        let loopback = "127.0.0.1:0".parse().unwrap();
        let settings = Settings::for_addrs(std::path::PathBuf::new(), loopback, loopback);
        let clock = ManualClock::new(UnixMillis(T0));
        let stop = CancellationToken::new();
        let store = PanicsOnce::default();
        let per_second = PerSecondStores {
            stores: Vec::new(),
            timeout: settings.sync.timeout,
        };
        let g = spawn(
            vec![store],
            per_second,
            &settings,
            Arc::new(clock.clone()),
            stop.clone(),
        )
        .await;
        let shard = g.health[0].clone();

        // One hit on one entity, queued for the shard as the hot path does.
        let limit = Limit {
            requests_per_unit: 100,
            window_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        };
        let cache = EntityTable::new(CacheSettings::default());
        g.queues.attach(cache.clone());
        cache.with(
            7,
            clock.now(),
            || vec![limit],
            |e| {
                crate::core::fixtures::hit(&mut e.state.states[0], &limit, clock.now(), 1);
                g.queues.mark_dirty(e.key, e.state, false);
            },
        );

        // The first sync call panics: the shard says so, and the failure is counted.
        wait_for("the shard degraded by the panic", || {
            shard
                .last_error()
                .is_some_and(|e| e == "sync task stopped: panicked: boom")
        })
        .await;
        assert_eq!(g.queues.stats.task_failures.load(Ordering::Relaxed), 1);

        // Restarted after the backoff, the task sends the hit the panicking call held.
        wait_for("the shard back to ok", || shard.status() == ShardStatus::Ok).await;
        wait_for("the queue to drain", || g.queues.is_empty()).await;
        assert_eq!(cache.get(7, |e| e.state.states[0].pending()), Some(0));
        assert_eq!(g.queues.stats.task_failures.load(Ordering::Relaxed), 1);
        stop.cancel();
        g.join().await;
    }
}
