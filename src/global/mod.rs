//! Starting global mode: [`connect`] opens the Redis stores (the sync's, and the exact rules'
//! client), [`spawn`] starts one sync task per shard and the clock-offset task over any stores
//! (Redis, or the simulator's in-memory one), the RLQS presence loop when the quota service
//! is on (`presence/`), the replica's join of the fleet (`join.rs`, which readiness waits
//! for) and registers the sync metrics. What global mode shares with the limiter and the
//! quota service is not built here: the caller builds it once ([`Parts`]: the entity table,
//! the [`Fleet`], the queues from [`Stores::queues`], the quota service's engine) and hands
//! the same to the limiter, the quota service and [`spawn`], so nothing is attached later.
//! `lib::run` calls both and, at shutdown, waits for [`Global::join`] (the tasks' final
//! flush); the simulator and the benches call [`spawn`]. Global mode's settings are its own
//! ([`Config`], `config.rs`).
//!
//! Every task runs under `supervise` (`supervise.rs`): one that panics or ends before
//! shutdown is logged, counted, marks its shard degraded with the reason, and is restarted
//! with backoff. The metrics are in `metrics.rs`.
//!
//! One axis, by backend: the features (`sync/`, `exact/`, `presence/`) hold the logic and the
//! store traits, with no Redis code; `redis/` holds all of it (scripts included) and
//! `memory/` the in-memory twin, each implementing the features' traits.

pub mod config;
pub mod exact;
mod join;
pub mod memory;
mod metrics;
pub mod presence;
pub mod redis;
mod supervise;
pub mod sync;

pub use config::{Config, PerSecondRedis, RedisSettings, SyncConfig, SyncSettings};
pub use exact::{ExactClient, ExactItem, ExactStore, ResetItem, ResetKind};
pub use join::{JoinStatus, Joining};
pub use presence::{Others, Presence, PresenceSource, PresenceStats};
pub use redis::OpenError;
pub use sync::{
    measure_offset, new_generation, new_replica_id, Answer, Beat, Fleet, Heartbeat, Publish,
    ResetNews, ResetRead, ShardHealth, ShardRouter, ShardStore, ShardSync, StoreError,
    StoreErrorKind, SyncItem, SyncOp, SyncQueues, SyncStats, Trip,
};

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::core::table::EntityTable;
use crate::global::redis::exact::RedisExact;
use crate::global::redis::RedisStore;
use crate::telemetry::Telemetry;
use metrics::register_metrics;
use presence::PresenceLoop;
use supervise::{supervise, Watch};

/// How often the clock offset from Redis is measured again.
const OFFSET_EVERY: Duration = Duration::from_secs(30);

/// Running global mode.
pub struct Global {
    /// Each shard's health.
    pub health: Vec<Arc<ShardHealth>>,
    /// The presence loop's counters (`presence/`): zeros when no engine was handed.
    pub presence: Arc<PresenceStats>,
    /// This replica's join of the fleet: readiness waits for [`Joining::done`].
    pub joining: Joining,
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

/// The stores global mode's sync runs on: the main group's shards, then the per-second
/// group's (empty without `REDIS_PERSECOND`).
pub struct Stores<S> {
    /// The main group's shards.
    pub main: Vec<Arc<S>>,
    /// The per-second group's shards.
    pub per_second: Vec<Arc<S>>,
}

impl<S> Stores<S> {
    /// One shard, no per-second group (the simulator's store).
    pub fn one(store: Arc<S>) -> Self {
        Stores {
            main: vec![store],
            per_second: Vec::new(),
        }
    }
}

impl<S: ShardStore> Stores<S> {
    /// The queues the hot path marks entities in, one per shard of these stores, routed as
    /// the sync routes them (per-second rules to the per-second group), holding at most
    /// `config.max_queued`: built before [`spawn`], so that the limiter and the quota
    /// service are built on them first and global mode is handed them ([`Parts::queues`]).
    pub fn queues(&self, config: &SyncConfig) -> Arc<SyncQueues> {
        let (main, per_second) = (shard_names(&self.main), shard_names(&self.per_second));
        Arc::new(SyncQueues::new(
            ShardRouter::with_per_second(&main, &per_second),
            main.len() + per_second.len(),
            config.max_queued,
        ))
    }
}

/// The stores' names, which route entities to them.
fn shard_names<S: ShardStore>(stores: &[Arc<S>]) -> Vec<String> {
    stores.iter().map(|s| s.name().to_string()).collect()
}

/// What [`spawn`] is handed, built once by its caller (the wiring, the simulator, the
/// benches), which hands the same table, fleet and queues to the limiter, and the fleet to
/// the quota service whose engine is `presence`.
pub struct Parts {
    /// The entities the limiter counts in, which the sync reads and settles.
    pub table: EntityTable,
    /// What this replica knows of the fleet: the heartbeats write it, decisions read it.
    pub fleet: Arc<Fleet>,
    /// Where the hot path queues entities with news ([`Stores::queues`] of the same stores).
    pub queues: Arc<SyncQueues>,
    /// The quota service's engine, when it is on: its streams per counter are published and
    /// the fleet's learnt every tick (`presence/`). Without it no presence task runs.
    pub presence: Option<Arc<dyn PresenceSource>>,
}

/// Opens the Redis stores of `config`: the sync's, and the exact rules' client (pools of
/// their own), which the wiring hands to the limiter. Nothing is dialled yet.
///
/// # Errors
/// When a Redis URL is unusable. An unreachable Redis is not an error: its shard starts
/// degraded and recovers when Redis answers.
pub fn connect(config: &Config) -> Result<(Stores<RedisStore>, ExactClient), OpenError> {
    crate::global::redis::init_tls();
    let stores = |r: &RedisSettings| -> Result<Vec<Arc<RedisStore>>, OpenError> {
        let all = RedisStore::all(&r.urls, r.cluster, r.sentinel.as_ref(), &r.options)?;
        Ok(all.into_iter().map(Arc::new).collect())
    };
    let per_second = match &config.per_second {
        Some(p) => stores(&p.redis)?,
        None => Vec::new(),
    };
    let stores = Stores {
        main: stores(&config.redis)?,
        per_second,
    };
    Ok((stores, exact_client(config)?))
}

/// Exact stores and the names that route to them.
type ExactStores = (Vec<Arc<dyn ExactStore>>, Vec<String>);

/// The exact stores of one Redis setting (pools of their own) and their routing names: the
/// sync's shards'.
fn exact_stores(redis: &RedisSettings) -> Result<ExactStores, OpenError> {
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
fn exact_client(config: &Config) -> Result<ExactClient, OpenError> {
    let (mut stores, main_names) = exact_stores(&config.redis)?;
    let mut timeout = config.sync.settings.timeout;
    let ps_names = match &config.per_second {
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
    )
    .with_reset_log_length(config.sync.settings.reset_log_length))
}

/// Starts global mode on `stores` with the `parts` the caller built (and handed to the
/// limiter and the quota service too): the clock corrected from the first store's time, one
/// supervised sync task per shard (which settle the table's entities the queues name and
/// write the heartbeats' news to the fleet), the clock-offset task, the presence loop (when
/// an engine is handed), the join of the fleet (unless `config.join_timeout` is zero; its
/// deadline counted from now) and the sync metrics. The tasks stop (after a final flush) on
/// `stop`. The service, the simulator and the benches all start global mode here.
///
/// # Panics
/// When `stores` has no main shard, or `parts.queues` were not made for `stores`
/// ([`Stores::queues`]).
pub async fn spawn<S: ShardStore>(
    config: SyncConfig,
    stores: Stores<S>,
    parts: Parts,
    clock: Arc<dyn Clock>,
    telemetry: &Telemetry,
    stop: CancellationToken,
) -> Global {
    let began = tokio::time::Instant::now();
    let Parts {
        table,
        fleet,
        queues,
        presence: source,
    } = parts;
    let (main_names, ps_names) = (shard_names(&stores.main), shard_names(&stores.per_second));
    let main_count = stores.main.len();
    let all: Vec<Arc<S>> = stores.main.into_iter().chain(stores.per_second).collect();
    assert_eq!(queues.shards(), all.len(), "queues made for other stores");
    // Correct the clock before the first decision, so this node's epochs match the fleet's.
    let offset_timeout = config.settings.timeout * 10;
    adjust_clock(&*all[0], &*clock, offset_timeout).await;
    tracing::debug!(
        replica = format!("{:016x}", fleet.replica_id()),
        "replica id"
    );
    let watch = |task, shard| Watch {
        task,
        shard,
        clock: clock.clone(),
        stats: queues.stats.clone(),
        stop: stop.clone(),
    };
    let mut tasks = Vec::new();
    let mut health = Vec::new();
    for (index, store) in all.iter().enumerate() {
        let h = Arc::new(ShardHealth::new(store.name().to_string()));
        health.push(h.clone());
        let mut settings = config.settings;
        if index >= main_count {
            settings.timeout = config.per_second_timeout;
        }
        let task = ShardSync {
            index,
            store: store.clone(),
            queues: queues.clone(),
            table: table.clone(),
            fleet: fleet.clone(),
            health: h.clone(),
            clock: clock.clone(),
            settings,
        };
        let w = watch("sync task", Some(h));
        tasks.push(spawn_sync(task, w, config.first_run_after));
    }
    let w = watch("clock-offset task", None);
    tasks.push(spawn_offset(all[0].clone(), offset_timeout, w));
    let presence = Arc::new(PresenceStats::default());
    let joining = spawn_join(&config, &all, &fleet, &clock, began, &stop, &mut tasks);
    if let Some(source) = source {
        let l = PresenceLoop {
            source,
            stats: presence.clone(),
            stores: all[..main_count].to_vec(),
            queues: queues.clone(),
            fleet: fleet.clone(),
            clock: clock.clone(),
            settings: config.settings,
        };
        let w = watch("presence task", None);
        tasks.push(tokio::spawn(supervise(w, move || {
            let (l, stop) = (l.clone(), stop.clone());
            l.run(stop)
        })));
    }
    tracing::info!(shards = ?main_names, per_second = ?ps_names, "global mode: syncing through Redis");
    let g = Global {
        health,
        presence,
        joining,
        tasks,
    };
    register_metrics(telemetry, &g, &queues, &fleet);
    g
}

/// The join of the fleet (`join.rs`), when on: its task, and what readiness waits for.
fn spawn_join<S: ShardStore>(
    config: &SyncConfig,
    stores: &[Arc<S>],
    fleet: &Arc<Fleet>,
    clock: &Arc<dyn Clock>,
    began: tokio::time::Instant,
    stop: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Joining {
    let off = config.join_timeout.is_zero();
    let (status, joining) = join::channel(fleet.clone(), off);
    if !off {
        let task = join::JoinTask {
            stores: stores.to_vec(),
            fleet: fleet.clone(),
            clock: clock.clone(),
            settings: config.settings,
            call_timeout: config.settings.timeout.max(config.per_second_timeout),
            timeout: config.join_timeout,
            deadline: began + config.join_timeout,
            status,
        };
        tasks.push(tokio::spawn(task.run(stop.clone())));
    }
    joining
}

/// A shard's sync task, supervised, its first run `after` from now.
fn spawn_sync<S: ShardStore>(task: ShardSync<S>, w: Watch, after: Duration) -> JoinHandle<()> {
    let stop = w.stop.clone();
    tokio::spawn(async move {
        if !after.is_zero() {
            tokio::time::sleep(after).await;
        }
        supervise(w, move || task.clone().run(stop.clone())).await;
    })
}

/// The clock-offset task, supervised: the offset measured again every [`OFFSET_EVERY`].
fn spawn_offset<S: ShardStore>(store: Arc<S>, timeout: Duration, w: Watch) -> JoinHandle<()> {
    let (clock, stop) = (w.clock.clone(), w.stop.clone());
    tokio::spawn(supervise(w, move || {
        let (store, clock, stop) = (store.clone(), clock.clone(), stop.clone());
        async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(OFFSET_EVERY) => adjust_clock(&*store, &*clock, timeout).await,
                }
            }
        }
    }))
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
    use crate::core::{Algorithm, Limit};
    use crate::global::memory::MemoryStore;
    use crate::global::sync::health::ShardStatus;
    use crate::global::sync::store::{in_steps, Answer, Others, Trip};
    use std::sync::atomic::{AtomicBool, Ordering};

    const T0: u64 = 1_700_000_040_000;

    /// A store whose first sync call panics (a bug in a reply's handling, say); then works.
    #[derive(Default)]
    struct PanicsOnce {
        inner: MemoryStore,
        panicked: AtomicBool,
    }

    impl PanicsOnce {
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

        async fn heartbeat(&self, beat: &Heartbeat) -> Result<Beat, StoreError> {
            self.inner.heartbeat(beat).await
        }
    }

    impl ShardStore for PanicsOnce {
        fn name(&self) -> &str {
            "panics-once"
        }
        async fn round_trip(&self, replica: u64, trip: Trip<'_>) -> Result<Answer, StoreError> {
            // Publishes nothing and finds no one else: a store of one replica.
            in_steps(
                trip,
                |items| self.sync(replica, items),
                |beat| self.heartbeat(beat),
                |p| async move { Ok(vec![Others::default(); p.items.len()]) },
            )
            .await
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
        let clock = ManualClock::new(UnixMillis(T0));
        let stop = CancellationToken::new();
        let store = Arc::new(PanicsOnce::default());
        let config = SyncConfig::new(SyncSettings::default(), 1_000_000);
        let telemetry = Telemetry::new().expect("a metrics pipeline");
        let cache = EntityTable::new(CacheSettings::default());
        let stores = Stores::one(store);
        let queues = stores.queues(&config);
        let parts = Parts {
            table: cache.clone(),
            fleet: Arc::new(Fleet::new(1)),
            queues: queues.clone(),
            presence: None,
        };
        let g = spawn(
            config,
            stores,
            parts,
            Arc::new(clock.clone()),
            &telemetry,
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
        cache.with(
            7,
            clock.now(),
            || vec![limit],
            |e| {
                crate::core::fixtures::hit(&mut e.state.states[0], &limit, clock.now(), 1);
                queues.mark_dirty(e.key, e.state, false);
            },
        );

        // The first sync call panics: the shard says so, and the failure is counted.
        wait_for("the shard degraded by the panic", || {
            shard
                .last_error()
                .is_some_and(|e| e == "sync task stopped: panicked: boom")
        })
        .await;
        assert_eq!(queues.stats.task_failures.load(Ordering::Relaxed), 1);

        // Restarted after the backoff, the task sends the hit the panicking call held.
        wait_for("the shard back to ok", || shard.status() == ShardStatus::Ok).await;
        wait_for("the queue to drain", || queues.is_empty()).await;
        assert_eq!(cache.get(7, |e| e.state.states[0].pending()), Some(0));
        assert_eq!(queues.stats.task_failures.load(Ordering::Relaxed), 1);
        stop.cancel();
        g.join().await;
    }
}
