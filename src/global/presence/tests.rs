//! Tests of the presence store's in-memory twin (expiry, removal, the others' sums) and of the
//! presence loop with a fake engine on tokio's paused clock (its rounds, ticks, routing per
//! shard, failures, removals, leaving; none without an engine).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::core::clock::UnixMillis;
use crate::global::memory::MemoryStore;
use crate::global::sync::store::{in_steps, Answer, Trip};
use crate::global::sync::ShardRouter;

const T0: u64 = 1_700_000_040_000;
const TTL: u64 = 3_000;

fn p(entity: u128, streams: u32, demand: f64) -> Presence {
    Presence {
        entity,
        streams,
        demand,
    }
}

fn others(streams: u64, demand: f64) -> Others {
    Others { streams, demand }
}

/// One presence call on `store`, run to its end.
fn call(store: &MemoryStore, replica: u64, items: &[Presence], now: u64) -> Vec<Others> {
    let fut = store.presence(replica, items, now, TTL);
    futures_util::FutureExt::now_or_never(fut)
        .expect("the memory store never waits")
        .expect("up")
}

#[test]
fn each_replica_reads_the_others_sums_without_its_own() {
    let s = MemoryStore::default();
    assert_eq!(call(&s, 1, &[p(7, 2, 10.0)], T0), vec![others(0, 0.0)]);
    assert_eq!(call(&s, 2, &[p(7, 3, 5.5)], T0), vec![others(2, 10.0)]);
    assert_eq!(call(&s, 3, &[p(7, 1, 0.25)], T0), vec![others(5, 15.5)]);
    // Each sees the two others, and another counter is apart.
    assert_eq!(
        call(&s, 1, &[p(7, 2, 10.0), p(8, 1, 1.0)], T0 + 10),
        vec![others(4, 5.75), others(0, 0.0)]
    );
    assert_eq!(call(&s, 2, &[p(8, 4, 2.0)], T0 + 20), vec![others(1, 1.0)]);
}

#[test]
fn a_replica_with_no_stream_left_is_removed_at_once() {
    let s = MemoryStore::default();
    call(&s, 1, &[p(7, 2, 10.0)], T0);
    call(&s, 2, &[p(7, 1, 1.0)], T0);
    assert_eq!(call(&s, 1, &[p(7, 0, 0.0)], T0 + 1), vec![others(1, 1.0)]);
    assert_eq!(call(&s, 2, &[p(7, 1, 1.0)], T0 + 2), vec![others(0, 0.0)]);
    // The last one leaving leaves no key.
    call(&s, 2, &[p(7, 0, 0.0)], T0 + 3);
    assert!(s.presence.lock().is_empty());
}

#[test]
fn an_entry_counts_until_its_expiry_and_not_after() {
    let s = MemoryStore::default();
    call(&s, 1, &[p(7, 2, 10.0)], T0);
    let read = |now| call(&s, 2, &[p(7, 0, 0.0)], now)[0];
    assert_eq!(read(T0 + TTL - 1), others(2, 10.0));
    assert_eq!(read(T0 + TTL), others(0, 0.0));
    // Dropped, not only skipped: an old clock does not bring it back.
    assert_eq!(read(T0), others(0, 0.0));
    assert!(s.presence.lock().is_empty());
    // Refreshed, it lasts from its refresh.
    call(&s, 1, &[p(7, 2, 10.0)], T0 + 5_000);
    call(&s, 1, &[p(7, 2, 10.0)], T0 + 7_000);
    assert_eq!(read(T0 + 9_999), others(2, 10.0));
}

#[test]
fn demand_is_kept_in_milli_requests_and_bounded() {
    let s = MemoryStore::default();
    call(
        &s,
        1,
        &[p(1, 1, 0.0004), p(2, 1, f64::NAN), p(3, 1, -5.0)],
        T0,
    );
    call(&s, 2, &[p(4, 1, f64::INFINITY), p(5, 1, 1.2346)], T0);
    let read = call(&s, 3, &[p(1, 0, 0.0), p(2, 0, 0.0), p(3, 0, 0.0)], T0);
    assert_eq!(read, vec![others(1, 0.0); 3]);
    let read = call(&s, 3, &[p(4, 0, 0.0), p(5, 0, 0.0)], T0);
    assert_eq!(read, vec![others(1, MAX_DEMAND), others(1, 1.235)]);
}

#[test]
fn a_store_that_is_down_fails_the_call() {
    let s = MemoryStore::default();
    s.down.store(true, Ordering::Relaxed);
    let items = [p(7, 1, 1.0)];
    let fut = s.presence(1, &items, T0, TTL);
    assert!(futures_util::FutureExt::now_or_never(fut).unwrap().is_err());
    assert!(s.presence.lock().is_empty());
}

/// An engine whose counters the test sets, recording what it is told.
#[derive(Default)]
struct Engine {
    local: Mutex<Vec<Presence>>,
    told: Mutex<Vec<Vec<(u128, Others)>>>,
}

impl Engine {
    fn set(&self, local: Vec<Presence>) {
        *self.local.lock() = local;
    }
    /// Everything told so far, replies flattened, by entity (the last value wins).
    fn last(&self) -> HashMap<u128, Others> {
        self.told.lock().iter().flatten().copied().collect()
    }
    fn replies(&self) -> usize {
        self.told.lock().len()
    }
}

impl PresenceSource for Engine {
    fn local(&self) -> Vec<Presence> {
        self.local.lock().clone()
    }
    fn others(&self, others: &[(u128, Others)]) {
        self.told.lock().push(others.to_vec());
    }
}

/// Unix time `T0` plus tokio's (paused) elapsed time.
#[derive(Debug, Clone, Copy)]
struct Paused(tokio::time::Instant);

impl Clock for Paused {
    fn now(&self) -> UnixMillis {
        UnixMillis(T0 + self.0.elapsed().as_millis() as u64)
    }
}

/// A replica's presence loop over `stores` (named `s0`, `s1`, …) with replica id `id`,
/// handed `engine`.
fn replica(
    id: u64,
    stores: &[Arc<MemoryStore>],
    engine: &Arc<Engine>,
) -> PresenceLoop<MemoryStore> {
    let names: Vec<String> = (0..stores.len()).map(|i| format!("s{i}")).collect();
    let queues = SyncQueues::new(ShardRouter::new(&names), names.len(), 1_000);
    PresenceLoop {
        source: engine.clone(),
        stats: Arc::default(),
        stores: stores.to_vec(),
        queues: Arc::new(queues),
        fleet: Arc::new(Fleet::new(id)),
        clock: Arc::new(Paused(tokio::time::Instant::now())),
        settings: SyncSettings::default(),
    }
}

fn ms(n: u64) -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(n))
}

fn calls(s: &MemoryStore) -> u64 {
    s.presence_calls.load(Ordering::Relaxed)
}

#[tokio::test(start_paused = true)]
async fn a_round_at_once_then_one_call_a_tick() {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 2, 4.0)]);
    let l = replica(1, std::slice::from_ref(&store), &engine);
    let (stats, stop) = (l.stats.clone(), CancellationToken::new());
    assert_eq!(calls(&store), 0);
    let task = tokio::spawn(l.run(stop.clone()));
    ms(1).await;
    // At once when started, then one call a tick (1 s).
    assert_eq!((calls(&store), engine.replies()), (1, 1));
    assert_eq!(engine.last()[&7], others(0, 0.0));
    ms(3_000).await;
    assert_eq!(calls(&store), 4);
    assert_eq!(stats.calls_ok.load(Ordering::Relaxed), 4);
    assert_eq!(stats.items_sent.load(Ordering::Relaxed), 4);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn counters_go_to_their_sync_shard_one_call_per_shard_with_items() {
    let stores: Vec<_> = (0..3).map(|_| Arc::new(MemoryStore::default())).collect();
    let entities: Vec<u128> = (1..=40).collect();
    let engine = Arc::new(Engine::default());
    engine.set(entities.iter().map(|&e| p(e, 1, 1.0)).collect());
    let l = replica(1, &stores, &engine);
    let queues = l.queues.clone();
    let stop = CancellationToken::new();
    let task = tokio::spawn(l.run(stop.clone()));
    ms(1).await;
    for (i, s) in stores.iter().enumerate() {
        let mut held: Vec<u128> = s.presence.lock().keys().copied().collect();
        held.sort_unstable();
        let want: Vec<u128> = entities
            .iter()
            .copied()
            .filter(|&e| queues.shard_of(e, false) == i)
            .collect();
        assert!(!want.is_empty(), "40 entities reach every shard");
        assert_eq!(held, want, "shard {i}");
        assert_eq!(calls(s), 1, "one call for the shard's items");
    }
    // Every counter told, shard by shard: one reply per shard.
    assert_eq!(engine.replies(), 3);
    assert_eq!(engine.last().len(), 40);

    // A shard with nothing to send gets no call.
    let only = entities[0];
    engine.set(vec![p(only, 1, 1.0)]);
    ms(1_000).await; // the removals go out
    ms(1_000).await;
    let on = queues.shard_of(only, false);
    for (i, s) in stores.iter().enumerate() {
        assert_eq!(calls(s), if i == on { 3 } else { 2 }, "shard {i}");
    }
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn replicas_on_one_store_see_each_others_streams_and_a_dead_one_expires() {
    let store = Arc::new(MemoryStore::default());
    let (ea, eb) = (Arc::new(Engine::default()), Arc::new(Engine::default()));
    ea.set(vec![p(7, 3, 30.0)]);
    eb.set(vec![p(7, 1, 5.0), p(8, 2, 1.0)]);
    let (a, b) = (
        replica(1, std::slice::from_ref(&store), &ea),
        replica(2, std::slice::from_ref(&store), &eb),
    );
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let ta = tokio::spawn(a.run(stop_a.clone()));
    ms(500).await;
    let tb = tokio::spawn(b.run(stop_b.clone()));
    ms(1_000).await;
    assert_eq!(ea.last()[&7], others(1, 5.0));
    assert_eq!(eb.last()[&7], others(3, 30.0));
    assert_eq!(eb.last()[&8], others(0, 0.0));

    // A dies without a word (its task aborted): B stops counting it within the TTL.
    ta.abort();
    ms(TTL + 1_000).await;
    assert_eq!(eb.last()[&7], others(0, 0.0));
    stop_b.cancel();
    tb.await.unwrap();
    // B left cleanly: nothing of it stays.
    assert!(store.presence.lock().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_counter_the_engine_drops_is_removed_at_the_next_tick() {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 1, 1.0), p(8, 1, 1.0)]);
    let l = replica(1, std::slice::from_ref(&store), &engine);
    let stop = CancellationToken::new();
    let task = tokio::spawn(l.run(stop.clone()));
    ms(1).await;
    engine.set(vec![p(8, 1, 1.0)]);
    ms(1_000).await;
    assert!(!store.presence.lock().contains_key(&7));
    // The removal was sent, but the engine is told only of what it named.
    let told = engine.told.lock().last().cloned().unwrap();
    assert_eq!(told, vec![(8, others(0, 0.0))]);
    stop.cancel();
    task.await.unwrap();
    assert!(store.presence.lock().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_store_that_fails_is_counted_and_the_engine_keeps_its_last_values() {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 1, 1.0)]);
    let l = replica(1, std::slice::from_ref(&store), &engine);
    let (stats, stop) = (l.stats.clone(), CancellationToken::new());
    // Another replica's streams, kept alive by hand.
    let other = |now| call(&store, 9, &[p(7, 4, 8.0)], now);
    other(T0);
    let task = tokio::spawn(l.run(stop.clone()));
    ms(1).await;
    assert_eq!((engine.replies(), engine.last()[&7]), (1, others(4, 8.0)));

    store.down.store(true, Ordering::Relaxed);
    ms(3_000).await;
    // Three ticks, three failed calls (one a tick: no retries in between), nothing told.
    assert_eq!(stats.calls_failed.load(Ordering::Relaxed), 3);
    assert_eq!(calls(&store), 1 + 4, "the other replica's, then the loop's");
    assert_eq!(engine.replies(), 1);

    store.down.store(false, Ordering::Relaxed);
    other(T0 + 3_500);
    ms(1_000).await;
    assert_eq!((engine.replies(), engine.last()[&7]), (2, others(4, 8.0)));
    assert_eq!(stats.calls_ok.load(Ordering::Relaxed), 2);
    stop.cancel();
    task.await.unwrap();
}

/// A store that never answers: each call times out.
#[derive(Default)]
struct Silent;

impl Silent {
    async fn sync(
        &self,
        _: u64,
        _: &[crate::global::SyncItem],
    ) -> Result<Vec<[u64; 2]>, StoreError> {
        std::future::pending().await
    }

    async fn heartbeat(
        &self,
        _: &crate::global::Heartbeat,
    ) -> Result<crate::global::Beat, StoreError> {
        std::future::pending().await
    }

    async fn presence(
        &self,
        _: u64,
        _: &[Presence],
        _: u64,
        _: u64,
    ) -> Result<Vec<Others>, StoreError> {
        std::future::pending().await
    }
}

impl ShardStore for Silent {
    fn name(&self) -> &str {
        "silent"
    }
    async fn round_trip(&self, replica: u64, trip: Trip<'_>) -> Result<Answer, StoreError> {
        in_steps(
            trip,
            |items| self.sync(replica, items),
            |beat| self.heartbeat(beat),
            |p| self.presence(replica, p.items, p.now_ms, p.ttl_ms),
        )
        .await
    }
    async fn time_ms(&self) -> Result<u64, StoreError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_never_answers_times_out_each_tick_and_stop_still_ends() {
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 1, 1.0)]);
    let l = PresenceLoop {
        source: engine.clone(),
        stats: Arc::default(),
        stores: vec![Arc::new(Silent)],
        queues: Arc::new(SyncQueues::new(ShardRouter::new(&["s".into()]), 1, 10)),
        fleet: Arc::new(Fleet::new(1)),
        clock: Arc::new(Paused(tokio::time::Instant::now())),
        settings: SyncSettings::default(),
    };
    let (stats, stop) = (l.stats.clone(), CancellationToken::new());
    let task = tokio::spawn(l.run(stop.clone()));
    ms(2_500).await;
    assert_eq!(stats.calls_failed.load(Ordering::Relaxed), 3);
    stop.cancel();
    // The leaving call is bounded by the timeout too.
    task.await.unwrap();
    assert_eq!(stats.calls_failed.load(Ordering::Relaxed), 4);
    assert_eq!(engine.replies(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_counter_named_twice_is_summed() {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 1, 1.5), p(7, 2, 2.0)]);
    let l = replica(1, std::slice::from_ref(&store), &engine);
    let stop = CancellationToken::new();
    let task = tokio::spawn(l.run(stop.clone()));
    ms(1).await;
    assert_eq!(call(&store, 2, &[p(7, 0, 0.0)], T0)[0], others(3, 3.5));
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_removal_that_fails_is_retried_until_the_entry_expired_then_forgotten() {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 1, 1.0)]);
    let l = replica(1, std::slice::from_ref(&store), &engine);
    let (stats, stop) = (l.stats.clone(), CancellationToken::new());
    let task = tokio::spawn(l.run(stop.clone()));
    ms(1).await;
    store.down.store(true, Ordering::Relaxed);
    engine.set(vec![p(8, 1, 1.0)]);
    let sent = || stats.items_sent.load(Ordering::Relaxed);
    // Ticks at 1 s and 2 s: 8, and 7's removal again (a call that failed may not have run).
    ms(2_000).await;
    assert_eq!(sent(), 1 + 2 + 2);
    // At 3 s, 7's entry expired in the store: no removal is due any more.
    ms(1_000).await;
    assert_eq!(sent(), 1 + 2 + 2 + 1);
    stop.cancel();
    task.await.unwrap();
}

/// Global mode started as the service starts it on `store`, handed `engine` (or none).
async fn spawned(
    store: &Arc<MemoryStore>,
    engine: Option<Arc<Engine>>,
    stop: &CancellationToken,
) -> crate::global::Global {
    use crate::global::{spawn, Parts, Stores, SyncConfig};
    let config = SyncConfig::new(SyncSettings::default(), 1_000);
    let telemetry = crate::telemetry::Telemetry::new().expect("a metrics pipeline");
    let clock = Arc::new(Paused(tokio::time::Instant::now()));
    let stores = Stores::one(store.clone());
    let parts = Parts {
        table: crate::core::table::EntityTable::new(Default::default()),
        fleet: Arc::new(Fleet::new(1)),
        queues: stores.queues(&config),
        presence: engine.map(|e| e as Arc<dyn PresenceSource>),
    };
    spawn(config, stores, parts, clock, &telemetry, stop.clone()).await
}

#[tokio::test(start_paused = true)]
async fn global_spawn_without_an_engine_makes_no_presence_call() {
    let store = Arc::new(MemoryStore::default());
    let stop = CancellationToken::new();
    let g = spawned(&store, None, &stop).await;
    ms(5_000).await;
    // The sync ran its ticks; no presence call without an engine.
    assert!(store.replicas.lock().len() == 1);
    assert_eq!(calls(&store), 0);
    assert_eq!(g.presence.calls_ok.load(Ordering::Relaxed), 0);
    stop.cancel();
    g.join().await;
    assert_eq!(calls(&store), 0, "nor when it stops");
}

#[tokio::test(start_paused = true)]
async fn global_spawn_runs_the_loop_on_the_engine_handed_and_it_leaves_at_stop() {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(Engine::default());
    engine.set(vec![p(7, 2, 1.0)]);
    let stop = CancellationToken::new();
    let g = spawned(&store, Some(engine.clone()), &stop).await;
    ms(1).await;
    assert_eq!((calls(&store), engine.replies()), (1, 1));
    assert!(store.presence.lock().contains_key(&7));
    assert_eq!(g.presence.calls_ok.load(Ordering::Relaxed), 1);
    ms(5_000).await;
    // The sync ran its ticks beside it, and the loop one call a tick.
    assert!(store.replicas.lock().len() == 1);
    assert_eq!(calls(&store), 6);
    stop.cancel();
    g.join().await;
    // Stopped cleanly: its streams no longer count anywhere.
    assert!(store.presence.lock().is_empty());
}
