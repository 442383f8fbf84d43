//! Global mode's background sync: per-shard queues of entities with news, and one task per
//! shard that every tick moves their hits to the shared store and the fleet's counts back.
//!
//! The hot path never waits on this: a request counts locally and, the first time an entity
//! has news, queues it on its shard ([`SyncQueues::mark_dirty`], under the entity's lock).
//! Each tick a shard task takes the entities that are due by [`SyncPolicy`] (cold ones at
//! once, hot ones every tick), turns their pending hits into in-flight deltas
//! ([`WindowState::begin_sync`]), and makes **one** call to its [`ShardStore`], which adds
//! the deltas and returns both epochs' totals. The replies settle the deltas
//! (`complete_sync`), so a node's own hits are counted exactly once. Each call also states
//! what this node's part of each counter held when last acknowledged, so a store that
//! restarted empty gets it back (`store.rs`). A failed call puts the
//! deltas back (`fail_sync`), marks the shard degraded and backs off; the hot path keeps
//! deciding from memory meanwhile.
//!
//! The tick's call also carries this replica's heartbeat ([`Heartbeat`]); its reply, the
//! live replica count, goes to [`SyncQueues::observe_live`], where the hot path reads it. The
//! final flush removes the heartbeat. A cold entity queued between ticks wakes the task for
//! an early round trip (the due entities only, no heartbeat), at most one between two ticks.
//! A young entity running into its prior in a burst wakes it for *burst reads* (the same,
//! and their replies measure the others however soon they come: `core/prior.rs`), at most
//! one every [`BURST_MIN_GAP`] and [`MAX_BURST_TRIPS`] between two ticks.
//!
//! Accuracy trade-off: between two syncs a node knows other nodes' hits only by extrapolating
//! the rate it saw between replies; `core/fleet.rs` and `core/prior.rs` explain the estimate.
//!
//! [`WindowState::begin_sync`]: crate::core::WindowState::begin_sync

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::health::ShardHealth;
use super::queue::SyncQueues;
use super::store::{Heartbeat, ShardStore, StoreError, SyncItem};
use crate::core::clock::{Clock, UnixMillis};
use crate::core::fleet::SyncPlan;
use crate::core::table::Entity;
use crate::core::tier::{SyncPolicy, Tier};

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
    /// Most items in one store call.
    pub max_batch: usize,
}

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            policy: SyncPolicy::default(),
            timeout: Duration::from_millis(100),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            max_batch: 20_000,
        }
    }
}

/// The most burst reads (`core/prior.rs`) a shard makes between two ticks: as many as fit,
/// back to back, in the 100 ms after a young entity's first reply during which it may want
/// them (`BURST_WINDOW_MS`). A burst stops wanting them once a reply shows the limit reached:
/// a 10× burst on a limit of 1,000 takes about 5 a replica in the simulator, a 2× one 20.
pub const MAX_BURST_TRIPS: u32 = 50;

/// The least time between the starts of two burst reads of a shard. A call at a time, they
/// are paced by the round trip itself; on a Redis nearer than this, by this.
const BURST_MIN_GAP: Duration = Duration::from_millis(2);

/// One shard's sync task.
pub struct ShardSync<S> {
    /// The shard's index.
    pub index: usize,
    /// Its store.
    pub store: Arc<S>,
    /// The queues.
    pub queues: Arc<SyncQueues>,
    /// Its health.
    pub health: Arc<ShardHealth>,
    /// The clock decisions use.
    pub clock: Arc<dyn Clock>,
    /// Cadence and limits.
    pub settings: SyncSettings,
}

impl<S> Clone for ShardSync<S> {
    fn clone(&self) -> Self {
        ShardSync {
            index: self.index,
            store: self.store.clone(),
            queues: self.queues.clone(),
            health: self.health.clone(),
            clock: self.clock.clone(),
            settings: self.settings,
        }
    }
}

struct Planned {
    entity: Arc<Entity>,
    plans: Vec<SyncPlan>,
}

/// What a round trip is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trip {
    /// The tick: the due entities and the heartbeat.
    Tick,
    /// Woken by a cold entity between ticks: the due entities only, if any.
    Early,
    /// Woken by a young entity running into its prior: the due entities only, if any, and
    /// the replies measure the others' rate however soon they come (`core/prior.rs`).
    Burst,
    /// Shutdown: everything pending, and the heartbeat removed.
    Flush,
}

impl<S: ShardStore> ShardSync<S> {
    /// Ticks until `shutdown`, then makes a final flush of everything pending. The first tick
    /// is at once, so the fleet's size is known before long; a cold entity queued between
    /// ticks wakes the task for an early round trip, at most one between two ticks.
    pub async fn run(self, shutdown: CancellationToken) {
        self.queues.set_tick_ms(self.settings.policy.tick_ms);
        let tick = Duration::from_millis(self.settings.policy.tick_ms);
        let mut backoff = self.settings.backoff_min;
        let mut next = tokio::time::Instant::now();
        let mut early_done = false;
        let mut bursts = 0;
        let mut burst_ready = tokio::time::Instant::now();
        loop {
            let early_ok = !early_done && !self.health.is_degraded();
            let burst_ok = bursts < MAX_BURST_TRIPS && !self.health.is_degraded();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
                _ = self.queues.woken(self.index), if early_ok => {
                    early_done = true;
                    // A failure marks the shard degraded: no more early trips until it answers.
                    let _ = self.trip(Trip::Early).await;
                    continue;
                }
                _ = self.queues.burst_woken(self.index), if burst_ok => {
                    bursts += 1;
                    tokio::time::sleep_until(burst_ready).await;
                    burst_ready = tokio::time::Instant::now() + BURST_MIN_GAP;
                    let _ = self.trip(Trip::Burst).await;
                    continue;
                }
            }
            // Wake-ups up to now are served by this tick.
            let _ = futures_util::FutureExt::now_or_never(self.queues.woken(self.index));
            let _ = futures_util::FutureExt::now_or_never(self.queues.burst_woken(self.index));
            early_done = false;
            bursts = 0;
            match self.tick(false).await {
                Ok(()) => {
                    backoff = self.settings.backoff_min;
                    next += tick;
                    // After a long stall, tick from now rather than catching up in a burst.
                    next = next.max(tokio::time::Instant::now());
                }
                Err(_) => {
                    next = tokio::time::Instant::now() + backoff.max(tick);
                    backoff = (backoff * 2).min(self.settings.backoff_max);
                }
            }
        }
        if let Err(e) = self.tick(true).await {
            tracing::error!(shard = %self.health.name, error = %e, "final flush failed; unsent hits are lost");
        } else {
            tracing::info!(shard = %self.health.name, "final flush done");
        }
    }

    /// One tick: syncs the due entities (all entities with pending hits when `flush`) and
    /// refreshes this replica's heartbeat (removes it when `flush`), in one round trip. The
    /// heartbeat goes even when nothing is due, so readiness tells the truth without traffic.
    ///
    /// # Errors
    /// The store's error; the deltas are kept for the next tick.
    pub async fn tick(&self, flush: bool) -> Result<(), StoreError> {
        self.trip(if flush { Trip::Flush } else { Trip::Tick })
            .await
    }

    /// How long a heartbeat lasts unrefreshed: three ticks, plus the longest backoff of a
    /// replica whose calls fail (it is still there, and its hits will arrive).
    pub(super) fn heartbeat_ttl_ms(&self) -> u64 {
        3 * self.settings.policy.tick_ms + self.settings.backoff_max.as_millis() as u64
    }

    async fn trip(&self, trip: Trip) -> Result<(), StoreError> {
        let stats = &self.queues.stats;
        stats.ticks.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let (planned, items) = self.plan(trip, now);
        let between_ticks = matches!(trip, Trip::Early | Trip::Burst);
        if items.is_empty() && between_ticks {
            return Ok(());
        }
        let beat = (!between_ticks).then(|| Heartbeat {
            replica: self.queues.replica_id(),
            now_ms: now.0,
            ttl_ms: self.heartbeat_ttl_ms(),
            leaving: trip == Trip::Flush,
        });
        // Until the reply is settled, the guard owns the in-flight entities: if the call
        // panics, dropping it puts their deltas back and requeues them, so a restarted task
        // sends them (see `global::supervise`).
        let mut in_flight = InFlight {
            planned,
            queues: &self.queues,
            index: self.index,
        };
        let result = self.call(&items, beat.as_ref()).await;
        let planned = std::mem::take(&mut in_flight.planned);
        let done = self.clock.now();
        match result {
            Ok((totals, live)) => {
                stats.calls_ok.fetch_add(1, Ordering::Relaxed);
                self.health.ok(done);
                if let (Some(n), Trip::Tick) = (live, trip) {
                    self.queues.observe_live(n, done);
                }
                self.settle(planned, totals, done);
                Ok(())
            }
            Err(e) => {
                stats.calls_failed.fetch_add(1, Ordering::Relaxed);
                self.health.failed(&e, done);
                let requeue = put_back(planned);
                if trip == Trip::Flush {
                    let lost: i64 = requeue
                        .iter()
                        .map(|e| {
                            let st = e.state.lock();
                            st.windows.iter().map(|w| w.pending().max(0)).sum::<i64>()
                        })
                        .sum();
                    stats
                        .deltas_dropped
                        .fetch_add(lost as u64, Ordering::Relaxed);
                }
                self.queues.requeue(self.index, requeue);
                Err(e)
            }
        }
    }

    /// Takes the shard's queue and begins a sync of every due entity; requeues the others
    /// (or releases them when they have nothing left to send).
    fn plan(&self, trip: Trip, now: UnixMillis) -> (Vec<Planned>, Vec<SyncItem>) {
        let flush = trip == Trip::Flush;
        let stats = &self.queues.stats;
        let policy = &self.settings.policy;
        let mut keep = Vec::new();
        let mut planned: Vec<Planned> = Vec::new();
        let mut items = Vec::new();
        for entity in self.queues.take(self.index) {
            let mut st = entity.state.lock();
            let pending: i64 = st.windows.iter().map(|w| w.pending()).sum();
            let due = if flush {
                pending != 0
            } else {
                !st.in_flight
                    && items.len() < self.settings.max_batch
                    && entity
                        .limits
                        .iter()
                        .zip(&st.windows)
                        .any(|(l, w)| policy.due(w, l, now, st.last_sync_ms))
            };
            if !due {
                if pending == 0 && !st.in_flight && st.windows.iter().all(|w| w.ever_synced()) {
                    // Nothing to send: the next hit queues it again.
                    self.queues.release(&mut st);
                } else {
                    drop(st);
                    keep.push(entity);
                }
                continue;
            }
            let mut plans = Vec::with_capacity(entity.limits.len());
            for (i, limit) in entity.limits.iter().enumerate() {
                let w = &mut st.windows[i];
                let tier = Tier::of(w.pressure(limit, now)) as usize;
                stats.synced_by_tier[tier].fetch_add(1, Ordering::Relaxed);
                let mut plan = w.begin_sync(limit, now);
                plan.burst = trip == Trip::Burst;
                items.push(SyncItem {
                    entity: entity.key,
                    limit: i as u8,
                    epochs: plan.epochs,
                    deltas: plan.deltas,
                    acked: plan.acked,
                    ttl_ms: 2 * limit.window_ms,
                });
                plans.push(plan);
            }
            st.in_flight = true;
            st.last_sync_ms = now.0;
            drop(st);
            planned.push(Planned { entity, plans });
        }
        self.queues.requeue(self.index, keep);
        (planned, items)
    }

    /// The store call (with the heartbeat, when given), within the timeout, with its
    /// counters. Returns the totals and, with a heartbeat, the live replicas.
    async fn call(
        &self,
        items: &[SyncItem],
        beat: Option<&Heartbeat>,
    ) -> Result<(Vec<[u64; 2]>, Option<u32>), StoreError> {
        let stats = &self.queues.stats;
        stats
            .items_sent
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        let commands = self.store.commands_for(items.len()) + usize::from(beat.is_some());
        stats
            .commands_sent
            .fetch_add(commands as u64, Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let call = async {
            match beat {
                Some(b) => {
                    self.store
                        .sync_and_beat(self.queues.replica_id(), items, b)
                        .await
                }
                None => self
                    .store
                    .sync(self.queues.replica_id(), items)
                    .await
                    .map(|t| (t, None)),
            }
        };
        let result = match tokio::time::timeout(self.settings.timeout, call).await {
            Ok(Ok((totals, live))) if totals.len() == items.len() => Ok((totals, live)),
            Ok(Ok((totals, _))) => Err(StoreError::Backend(format!(
                "store answered {} totals for {} items",
                totals.len(),
                items.len()
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout(self.settings.timeout)),
        };
        stats
            .call_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        result
    }

    /// Settles a successful reply: each entity's deltas are counted and the fleet's totals
    /// taken in; entities with hits since (or, in a fleet, not settled yet) are requeued, the
    /// others released.
    fn settle(&self, planned: Vec<Planned>, totals: Vec<[u64; 2]>, done: UnixMillis) {
        let stats = &self.queues.stats;
        let tick_ms = self.settings.policy.tick_ms;
        let mut totals = totals.into_iter();
        let mut requeue = Vec::new();
        for p in planned {
            let mut st = p.entity.state.lock();
            for (i, plan) in p.plans.iter().enumerate() {
                let limit = &p.entity.limits[i];
                let total = totals.next().unwrap_or([0, 0]);
                let w = &mut st.windows[i];
                let before = w.pressure(limit, done);
                let tier_before = Tier::of(before);
                w.complete_sync(limit, plan, total, done);
                let after = w.pressure(limit, done);
                let drift = ((after - before).abs() * f64::from(limit.requests_per_unit)) as u64;
                stats.drift_hits.fetch_add(drift, Ordering::Relaxed);
                if Tier::of(after) != tier_before {
                    stats.tier_transitions.fetch_add(1, Ordering::Relaxed);
                }
            }
            st.in_flight = false;
            // In a fleet, an entity stays queued until its first reply is a tick old: until
            // then its node keeps to the prior (`core/prior.rs`), so a quiet entity read once
            // must not stay there until its next hit.
            let settling =
                self.queues.live_replicas() > 1 && st.windows.iter().any(|w| !w.settled(tick_ms));
            if settling || st.windows.iter().any(|w| w.pending() != 0) {
                drop(st);
                requeue.push(p.entity);
            } else {
                self.queues.release(&mut st);
            }
        }
        self.queues.requeue(self.index, requeue);
    }
}

/// Undoes the beginning of a sync that got no reply: the deltas go back to pending.
fn put_back(planned: Vec<Planned>) -> Vec<Arc<Entity>> {
    planned
        .into_iter()
        .map(|p| {
            let mut st = p.entity.state.lock();
            for (i, plan) in p.plans.iter().enumerate() {
                st.windows[i].fail_sync(plan);
            }
            st.in_flight = false;
            drop(st);
            p.entity
        })
        .collect()
}

/// The entities of a store call in progress; dropped before the reply is settled (the call
/// panicked, or the task was aborted mid-call), it puts their deltas back and requeues them,
/// so they are neither lost nor stuck in flight.
struct InFlight<'a> {
    planned: Vec<Planned>,
    queues: &'a SyncQueues,
    index: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.planned.is_empty() {
            let requeue = put_back(std::mem::take(&mut self.planned));
            self.queues.requeue(self.index, requeue);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::core::clock::{ManualClock, UnixMillis};
    use crate::core::table::{CacheSettings, EntityCache};
    use crate::core::window::{Algorithm, Limit};
    use crate::global::clock_offset::measure_offset;
    use crate::global::memory::MemoryStore as FakeStore;
    use crate::global::queue::ShardRouter;

    pub(crate) const T0: u64 = 1_700_000_040_000;

    pub(crate) fn limit() -> Limit {
        Limit {
            requests_per_unit: 100,
            window_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        }
    }

    pub(crate) fn setup() -> (
        EntityCache,
        Arc<SyncQueues>,
        ShardSync<FakeStore>,
        ManualClock,
    ) {
        let clock = ManualClock::new(UnixMillis(T0));
        let queues =
            Arc::new(SyncQueues::new(ShardRouter::new(&["a".into()]), 1, 1000).with_replica_id(1));
        let sync = ShardSync {
            index: 0,
            store: Arc::new(FakeStore::default()),
            queues: queues.clone(),
            health: Arc::new(ShardHealth::new("fake".into())),
            clock: Arc::new(clock.clone()),
            settings: SyncSettings::default(),
        };
        (
            EntityCache::new(CacheSettings::default()),
            queues,
            sync,
            clock,
        )
    }

    fn hit(cache: &EntityCache, queues: &SyncQueues, key: u128, clock: &ManualClock, n: u64) {
        let (e, _) = cache.get_or_create(key, || Box::new([limit()]));
        let mut st = e.state.lock();
        for _ in 0..n {
            crate::core::decide(&mut st.windows[0], &limit(), clock.now(), 1);
        }
        queues.mark_dirty(&e, &mut st);
    }

    #[tokio::test]
    async fn one_call_per_tick_carries_every_due_entity() {
        let (cache, queues, sync, clock) = setup();
        for key in 0..50 {
            hit(&cache, &queues, key, &clock, 2);
        }
        assert_eq!(queues.len(), 50);
        sync.tick(false).await.unwrap();
        assert_eq!(sync.store.calls.load(Ordering::Relaxed), 1);
        assert_eq!(sync.store.total(7, 0, T0 / 60_000), 2);
        // Synced and quiet: released from the queue until the next hit.
        assert!(queues.is_empty());
    }

    #[tokio::test]
    async fn a_failed_call_keeps_the_deltas_and_the_next_one_sends_them() {
        let (cache, queues, sync, clock) = setup();
        hit(&cache, &queues, 1, &clock, 3);
        sync.store.down.store(true, Ordering::Relaxed);
        assert!(sync.tick(false).await.is_err());
        assert!(sync.health.is_degraded());
        hit(&cache, &queues, 1, &clock, 1);
        sync.store.down.store(false, Ordering::Relaxed);
        sync.tick(false).await.unwrap();
        assert!(!sync.health.is_degraded());
        assert_eq!(sync.store.total(1, 0, T0 / 60_000), 4);
    }

    #[tokio::test]
    async fn flush_sends_what_is_pending_even_when_not_due() {
        let (cache, queues, sync, clock) = setup();
        // Two syncs make the entity warm (its fleet rate known)...
        for _ in 0..2 {
            hit(&cache, &queues, 9, &clock, 1);
            sync.tick(false).await.unwrap();
            clock.advance_ms(1000);
        }
        // ...after which a hit right after a sync of an idle entity is not due for a while...
        hit(&cache, &queues, 9, &clock, 1);
        sync.tick(false).await.unwrap();
        assert_eq!(sync.store.total(9, 0, T0 / 60_000), 2);
        // ...but a final flush sends it.
        sync.tick(true).await.unwrap();
        assert_eq!(sync.store.total(9, 0, T0 / 60_000), 3);
    }

    #[tokio::test]
    async fn a_store_that_restarts_empty_gets_this_nodes_hits_back_with_the_next_hit() {
        let (cache, queues, sync, clock) = setup();
        hit(&cache, &queues, 5, &clock, 30);
        sync.tick(false).await.unwrap();
        // Another replica's part, then a restart that loses both.
        let e = T0 / 60_000;
        sync.store
            .counters
            .lock()
            .get_mut(&(5, 0, e))
            .unwrap()
            .insert(2, 40);
        sync.store.flush_all();
        clock.advance_ms(1000);
        hit(&cache, &queues, 5, &clock, 1);
        sync.tick(false).await.unwrap();
        // This node's 30 are back beside the new hit; the other's come with its next sync.
        assert_eq!(sync.store.total(5, 0, e), 31);
        assert_eq!(sync.store.counters.lock()[&(5, 0, e)][&1], 31);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_store_is_retried_with_exponential_backoff() {
        let (cache, queues, mut sync, clock) = setup();
        sync.store.down.store(true, Ordering::Relaxed);
        hit(&cache, &queues, 3, &clock, 1);
        let (store, stop) = (sync.store.clone(), CancellationToken::new());
        sync.settings.policy.tick_ms = 1000;
        let task = tokio::spawn(sync.run(stop.clone()));
        tokio::time::sleep(Duration::from_secs(30)).await;
        // Failures at 1, 2, 3, 4 s (backoff under the tick), then after 1.6, 3.2, 5, 5, 5 s...
        let calls = store.calls.load(Ordering::Relaxed);
        assert!((7..=10).contains(&calls), "{calls} calls in 30 s");
        // Back up: the next attempt succeeds and keeps the hit.
        store.down.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(store.total(3, 0, T0 / 60_000), 1);
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn offset_is_the_store_time_minus_local_time() {
        let (_, _, sync, clock) = setup();
        clock.set(UnixMillis(1_700_000_000_000));
        let off = measure_offset(&*sync.store, &clock, Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(off, 5_000);
    }
}
