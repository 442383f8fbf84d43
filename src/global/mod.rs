//! Starting global mode: the Redis stores, one sync task per shard, the clock-offset task and
//! the sync metrics. `lib::run` calls [`start`] and, at shutdown, waits for [`Global::join`]
//! (the tasks' final flush).
//!
//! Every task runs under `supervise`: one that panics or ends before shutdown is logged,
//! counted, marks its shard degraded with the reason, and is restarted with backoff.

pub mod exact;
mod metrics;
pub mod redis;
mod supervise;
pub mod sync;

pub use exact::{ExactClient, ExactItem, ExactStore};
pub use sync::{
    measure_offset, new_replica_id, Heartbeat, ShardHealth, ShardRouter, ShardStore, ShardSync,
    StoreError, SyncItem, SyncOp, SyncQueues, SyncSettings, SyncStats,
};

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::redis::RedisStore;
use crate::settings::{RedisSettings, Settings};
use crate::telemetry::Telemetry;
use metrics::register_metrics;
use supervise::{supervise, Watch};

/// How often the clock offset from Redis is measured again.
const OFFSET_EVERY: Duration = Duration::from_secs(30);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::{ManualClock, UnixMillis};
    use crate::core::table::{CacheSettings, EntityTable};
    use crate::core::window::{Algorithm, Limit};
    use crate::global::sync::health::ShardStatus;
    use crate::global::sync::memory::MemoryStore;
    use std::sync::atomic::{AtomicBool, Ordering};

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
                crate::core::decide(&mut e.state.states[0], &limit, clock.now(), 1);
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
