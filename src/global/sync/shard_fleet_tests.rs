//! Tests of the fleet side of the sync task: heartbeats and the live count, a clean stop
//! leaving at once, a store that lost the sync's keys, early round trips for cold entities,
//! burst reads, and the Redis load they add.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::shard::tests::{limit, on, setup, T0};
use super::store::{in_steps, Answer, Beat, Heartbeat, Others, Trip};
use super::{
    Fleet, ShardHealth, ShardRouter, ShardStore, ShardSync, StoreError, SyncItem, SyncQueues,
};
use crate::core::clock::{Clock, UnixMillis};
use crate::core::table::{CacheSettings, EntityTable};
use crate::global::memory::MemoryStore as FakeStore;

/// Unix time `T0` plus tokio's (paused) elapsed time, as the simulator's clock.
#[derive(Debug, Clone, Copy)]
struct Paused(tokio::time::Instant);

impl Clock for Paused {
    fn now(&self) -> UnixMillis {
        UnixMillis(T0 + self.0.elapsed().as_millis() as u64)
    }
}

/// `setup`, on tokio's paused clock.
fn paused() -> (EntityTable, Arc<SyncQueues>, ShardSync<FakeStore>, Paused) {
    let (cache, queues, mut sync, _) = setup();
    let clock = Paused(tokio::time::Instant::now());
    sync.clock = Arc::new(clock);
    (cache, queues, sync, clock)
}

fn hit_at(cache: &EntityTable, queues: &SyncQueues, key: u128, now: UnixMillis) {
    on(cache, key, now, |st| {
        crate::core::fixtures::hit(&mut st.states[0], &limit(), now, 1);
        queues.mark_dirty(key, st, false);
    });
}

#[tokio::test(start_paused = true)]
async fn a_cold_entity_is_synced_at_once_with_one_early_trip_between_ticks() {
    let (cache, queues, sync, clock) = paused();
    let (store, stop) = (sync.store.clone(), CancellationToken::new());
    let task = tokio::spawn(sync.run(stop.clone()));
    let ms = |n| tokio::time::sleep(Duration::from_millis(n));
    ms(10).await; // the first tick (a heartbeat alone) is behind us
    hit_at(&cache, &queues, 1, clock.now());
    ms(1).await;
    // Synced at once, not at the tick 1 s later.
    assert_eq!(store.total(1, 0, T0 / 60_000), 1);
    // More cold entities before the tick wait for it: one early trip per tick at most.
    for key in 2..50 {
        hit_at(&cache, &queues, key, clock.now());
        ms(10).await;
    }
    assert_eq!(store.calls.load(Ordering::Relaxed), 1);
    ms(1000).await;
    assert_eq!(store.calls.load(Ordering::Relaxed), 2);
    assert_eq!(store.total(49, 0, T0 / 60_000), 1);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn redis_load_stays_under_a_hundredth_of_a_command_per_request() {
    // The target: 10k entities at 50k requests a second, every one of them new at the
    // start (each wakes the task; at most one early trip runs between two ticks).
    let (cache, queues, sync, clock) = paused();
    let stop = CancellationToken::new();
    let task = tokio::spawn(sync.clone().run(stop.clone()));
    let requests = 50 * 4_000u64;
    for i in 0..requests {
        hit_at(&cache, &queues, u128::from(i % 10_000), clock.now());
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let commands = queues.stats.commands_sent.load(Ordering::Relaxed);
    // Per second: a heartbeat, and a tick's and an early trip's script calls of 500
    // items each: at most 1 + 2 × 20 = 41, against 50,000 requests.
    assert!(commands <= 4 * 41, "{commands} commands");
    assert!((commands as f64) / (requests as f64) <= 0.01);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn heartbeats_count_the_live_replicas_and_a_clean_stop_leaves_at_once() {
    let (_, _, a, clock) = setup();
    let b = another(&a);
    let (fleet_a, fleet_b) = (a.fleet.clone(), b.fleet.clone());
    a.tick(false).await.unwrap();
    b.tick(false).await.unwrap();
    a.tick(false).await.unwrap();
    assert_eq!((fleet_a.live_replicas(), fleet_b.live_replicas()), (2, 2));
    // A's second tick counted B: a rise from 1, which entities young before it keep to.
    let fleet = fleet_a.view();
    assert_eq!((fleet.before_rise, fleet.rose_at), (1, T0));
    // B stops cleanly: its final flush removes its heartbeat, and A's next tick sees it.
    b.tick(true).await.unwrap();
    clock.advance_ms(1000);
    a.tick(false).await.unwrap();
    let fleet = fleet_a.view();
    assert_eq!(
        (fleet.live, fleet.before, fleet.dropped_at),
        (1, 2, T0 + 1000)
    );
    // A replica that stops answering is dropped once its heartbeat is older than the TTL.
    b.tick(false).await.unwrap();
    clock.advance_ms(b.heartbeat_ttl_ms() + 1);
    a.tick(false).await.unwrap();
    assert_eq!(fleet_a.live_replicas(), 1);
}

/// Another replica's task on `a`'s store, with queues, table, fleet (id 2) and health of
/// its own.
fn another(a: &ShardSync<FakeStore>) -> ShardSync<FakeStore> {
    ShardSync {
        queues: Arc::new(SyncQueues::new(ShardRouter::new(&["a".into()]), 1, 1000)),
        table: EntityTable::new(CacheSettings::default()),
        fleet: Arc::new(Fleet::new(2)),
        health: Arc::new(ShardHealth::new("fake".into())),
        ..a.clone()
    }
}

#[tokio::test]
async fn every_replica_notices_a_store_that_lost_the_syncs_keys_and_nothing_else() {
    // A fresh fleet: A's first heartbeat writes the generation, B reads it. Nothing lost.
    let (cache, queues, a, clock) = setup();
    let b = another(&a);
    let resets = |s: &ShardSync<FakeStore>| s.health.resets();
    for s in [&a, &b, &a, &b] {
        s.tick(false).await.unwrap();
    }
    assert_eq!((resets(&a), resets(&b)), (0, 0));
    // Counters expiring (an idle entity's) leave the generation alone.
    hit_at(&cache, &queues, 1, clock.now());
    a.tick(false).await.unwrap();
    a.store.counters.lock().clear();
    for s in [&a, &b] {
        s.tick(false).await.unwrap();
    }
    assert_eq!((resets(&a), resets(&b)), (0, 0));
    // The store restarts empty: each replica's next heartbeat notices, once.
    hit_at(&cache, &queues, 1, clock.now());
    a.tick(false).await.unwrap();
    a.store.flush_all();
    for s in [&b, &a, &b, &a] {
        s.tick(false).await.unwrap();
    }
    assert_eq!((resets(&a), resets(&b)), (1, 1));
    // A replica started since has nothing to compare with: the new generation is all it knows.
    let c = another(&a);
    c.tick(false).await.unwrap();
    assert_eq!(resets(&c), 0);
    // A second loss is a second one, whoever writes the generation first.
    a.store.flush_all();
    for s in [&c, &a, &b] {
        s.tick(false).await.unwrap();
    }
    assert_eq!((resets(&a), resets(&b), resets(&c)), (2, 2, 1));
    // A's part comes back with its next sync of the entity: 2 hits, and 1 more.
    hit_at(&cache, &queues, 1, clock.now());
    a.tick(false).await.unwrap();
    assert_eq!(a.store.total(1, 0, T0 / 60_000), 3);
}

#[tokio::test]
async fn in_a_fleet_an_entity_stays_queued_until_its_first_reply_is_a_tick_old() {
    let (cache, queues, sync, clock) = setup();
    let hit = |key| {
        on(&cache, key, clock.now(), |st| {
            crate::core::fixtures::hit(&mut st.states[0], &limit(), clock.now(), 1);
            queues.mark_dirty(key, st, false);
        });
    };
    // Alone: one reply and the quiet entity is released, as before.
    hit(1);
    sync.tick(false).await.unwrap();
    assert!(queues.is_empty());
    // In a fleet: read again on the next ticks, until a reply a tick after the first, so
    // that its next hit, whenever it comes, is decided on a settled count, not the prior.
    sync.store.replicas.lock().insert(42, T0); // another replica's heartbeat
    hit(2);
    sync.tick(false).await.unwrap();
    assert_eq!(queues.len(), 1);
    clock.advance_ms(1_000);
    sync.tick(false).await.unwrap();
    assert!(queues.is_empty());
}

#[tokio::test(start_paused = true)]
async fn burst_reads_are_paced_and_capped_between_ticks() {
    let (cache, queues, mut sync, clock) = setup();
    sync.settings.policy.tick_ms = 1000;
    let fleet = sync.fleet.clone();
    hit_at(&cache, &queues, 1, clock.now());
    let e = 1;
    let (store, stop) = (sync.store.clone(), CancellationToken::new());
    let task = tokio::spawn(sync.run(stop.clone()));
    // The first tick, at once. Then, in a fleet (as this store's heartbeats cannot say)
    // and young (its clock stands still), the entity stays queued once hit again.
    tokio::time::sleep(Duration::from_millis(1)).await;
    fleet.set_live_replicas(4);
    hit_at(&cache, &queues, 1, clock.now());
    let calls = || store.calls.load(Ordering::Relaxed);
    let after_tick = calls();
    // Wanted every millisecond for 150 ms: one a millisecond, and no more than the cap.
    for _ in 0..150 {
        queues.want_burst_read(e, false);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        calls() - after_tick,
        u64::from(super::shard::MAX_BURST_TRIPS)
    );
    // The next tick lifts the cap.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    fleet.set_live_replicas(4);
    hit_at(&cache, &queues, 1, clock.now());
    let after_next = calls();
    queues.want_burst_read(e, false);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(calls(), after_next + 1);
    stop.cancel();
    task.await.unwrap();
}

/// The fake store a round trip of 4 ms away, counting its calls under way at once.
#[derive(Default)]
struct Distant {
    inner: FakeStore,
    under_way: AtomicU64,
    most: AtomicU64,
}

impl Distant {
    async fn sync(&self, replica: u64, items: &[SyncItem]) -> Result<Vec<[u64; 2]>, StoreError> {
        let now = self.under_way.fetch_add(1, Ordering::Relaxed) + 1;
        self.most.fetch_max(now, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let totals = self.inner.sync(replica, items).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.under_way.fetch_sub(1, Ordering::Relaxed);
        totals
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<Beat, StoreError> {
        self.inner.heartbeat(beat).await
    }
}

impl ShardStore for Distant {
    fn name(&self) -> &str {
        "distant"
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

#[tokio::test(start_paused = true)]
async fn two_burst_reads_of_an_entity_go_at_once_and_count_its_hits_once() {
    let (cache, queues, fake, clock) = paused();
    let sync = ShardSync {
        store: Arc::new(Distant::default()),
        index: fake.index,
        queues: fake.queues.clone(),
        table: fake.table.clone(),
        fleet: fake.fleet.clone(),
        health: fake.health.clone(),
        clock: fake.clock.clone(),
        settings: fake.settings,
    };
    let (store, stop, fleet) = (
        sync.store.clone(),
        CancellationToken::new(),
        sync.fleet.clone(),
    );
    let task = tokio::spawn(sync.run(stop.clone()));
    let ms = |n| tokio::time::sleep(Duration::from_millis(n));
    ms(10).await; // the first tick
    fleet.set_live_replicas(4);
    let e = 1;
    // A young entity hit and wanting burst reads every millisecond for 20 ms.
    let mut both = false;
    for _ in 0..20 {
        hit_at(&cache, &queues, 1, clock.now());
        queues.want_burst_read(e, false);
        ms(1).await;
        both |= cache.get(e, |e| e.state.in_flight) == Some(2);
    }
    // Two under way at once, a millisecond apart: about one every 2 ms of the 4 ms round
    // trip, where one at a time made one every 4 ms.
    let calls = store.inner.calls.load(Ordering::Relaxed);
    assert!(both && store.most.load(Ordering::Relaxed) == 2);
    assert!((9..=12).contains(&calls), "{calls} calls");
    // Once settled, every hit is in the store once, and nothing is left in flight.
    ms(10).await;
    let settled = { cache.get(e, |e| (e.state.in_flight, e.state.states[0].pending())) };
    assert_eq!(settled, Some((0, 0)));
    assert_eq!(store.inner.total(1, 0, T0 / 60_000), 20);
    assert_eq!(queues.len(), 1);
    stop.cancel();
    task.await.unwrap();
}
