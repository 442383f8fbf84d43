//! `shard.rs`'s unit tests, and the fixtures `shard_fleet_tests.rs` shares.

use super::*;
use crate::core::clock::{ManualClock, UnixMillis};
use crate::core::table::{CacheSettings, EntityTable};
use crate::core::{Algorithm, Limit};
use crate::global::memory::MemoryStore as FakeStore;
use crate::global::sync::clock_offset::measure_offset;
use crate::global::sync::fleet::Fleet;
use crate::global::sync::queue::ShardRouter;

pub(crate) const T0: u64 = 1_700_000_040_000;

pub(crate) fn limit() -> Limit {
    Limit {
        requests_per_unit: 100,
        window_ms: 60_000,
        algorithm: Algorithm::FixedWindow,
    }
}

pub(crate) fn setup() -> (
    EntityTable,
    Arc<SyncQueues>,
    ShardSync<FakeStore>,
    ManualClock,
) {
    setup_queuing(1000)
}

/// [`setup`], with queues holding up to `max_queued` entities.
fn setup_queuing(
    max_queued: usize,
) -> (
    EntityTable,
    Arc<SyncQueues>,
    ShardSync<FakeStore>,
    ManualClock,
) {
    let clock = ManualClock::new(UnixMillis(T0));
    let queues = Arc::new(SyncQueues::new(
        ShardRouter::new(&["a".into()]),
        1,
        max_queued,
    ));
    let table = EntityTable::new(CacheSettings::default());
    let sync = ShardSync {
        index: 0,
        store: Arc::new(FakeStore::default()),
        queues: queues.clone(),
        table: table.clone(),
        fleet: Arc::new(Fleet::new(1)),
        health: Arc::new(ShardHealth::new("fake".into())),
        clock: Arc::new(clock.clone()),
        settings: SyncSettings::default(),
    };
    (table, queues, sync, clock)
}

/// Calls `f` on the entity `key` of one [`limit`], created if absent.
pub(crate) fn on<R>(
    table: &EntityTable,
    key: u128,
    now: UnixMillis,
    f: impl FnOnce(&mut crate::core::table::EntityState) -> R,
) -> R {
    table.with(key, now, || vec![limit()], |e| f(e.state)).0
}

fn hit(cache: &EntityTable, queues: &SyncQueues, key: u128, clock: &ManualClock, n: u64) {
    on(cache, key, clock.now(), |st| {
        for _ in 0..n {
            crate::core::fixtures::hit(&mut st.states[0], &limit(), clock.now(), 1);
        }
        queues.mark_dirty(key, st, false);
    });
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
async fn a_call_that_timed_out_but_ran_is_not_counted_again_when_resent() {
    // Redis slower than the timeout: every call runs there, and every reply comes too late.
    let (cache, queues, sync, clock) = setup();
    hit(&cache, &queues, 1, &clock, 70);
    sync.store.late.store(true, Ordering::Relaxed);
    for _ in 0..3 {
        assert!(sync.tick(false).await.is_err());
        hit(&cache, &queues, 1, &clock, 10);
    }
    sync.store.late.store(false, Ordering::Relaxed);
    sync.tick(false).await.unwrap();
    assert_eq!(sync.store.total(1, 0, T0 / 60_000), 100);
    // And the replica sees its own hits once: 100 of 100 used.
    let count = on(&cache, 1, clock.now(), |st| {
        crate::core::fixtures::hit(&mut st.states[0], &limit(), clock.now(), 0).count_after
    });
    assert_eq!(count, 100);
}

#[tokio::test]
async fn a_bucket_call_that_timed_out_but_ran_spends_nothing_twice() {
    let (cache, queues, sync, clock) = setup();
    let l = Limit {
        requests_per_unit: 10,
        window_ms: 1000,
        algorithm: Algorithm::TokenBucket { burst: 100 },
    };
    let spend = |n| {
        cache.with(
            3,
            clock.now(),
            || vec![l],
            |e| {
                for _ in 0..n {
                    crate::core::fixtures::hit(&mut e.state.states[0], &l, clock.now(), 1);
                }
                queues.mark_dirty(3, e.state, false);
            },
        )
    };
    spend(40);
    sync.store.late.store(true, Ordering::Relaxed);
    for _ in 0..3 {
        assert!(sync.tick(false).await.is_err());
        spend(5);
    }
    sync.store.late.store(false, Ordering::Relaxed);
    sync.tick(false).await.unwrap();
    let b = &sync.store.buckets.lock()[&(3, 0)];
    // 55 tokens spent at one instant: the bucket is 55 tokens (5.5 s at 10/s) below full.
    assert_eq!(b.spent, 55);
    assert_eq!(b.tat_ns / 1000, clock.now().0 * 1000 + 5_500_000);
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
        .insert(
            2,
            crate::core::Held {
                hits: 40,
                ..Default::default()
            },
        );
    sync.store.flush_all();
    clock.advance_ms(1000);
    hit(&cache, &queues, 5, &clock, 1);
    sync.tick(false).await.unwrap();
    // This node's 30 are back beside the new hit; the other's come with its next sync.
    assert_eq!(sync.store.total(5, 0, e), 31);
    assert_eq!(sync.store.counters.lock()[&(5, 0, e)][&1].hits, 31);
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

/// Runs `sync`'s task for `secs` seconds of paused time on `entities` new entities of a hit
/// each, with a store taking `per_item_ns` a call item; returns the task's counters.
async fn drain(entities: u128, per_item_ns: u64, secs: u64) -> (Arc<SyncQueues>, Arc<ShardHealth>) {
    let (cache, queues, sync, clock) = setup_queuing(entities as usize);
    for key in 0..entities {
        hit(&cache, &queues, key, &clock, 1);
    }
    sync.store.per_item_ns.store(per_item_ns, Ordering::Relaxed);
    let (store, health, stop) = (
        sync.store.clone(),
        sync.health.clone(),
        CancellationToken::new(),
    );
    let task = tokio::spawn(sync.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    // Every hit is in the store, and nothing waits.
    let counted: i64 = (0..entities)
        .map(|key| store.total(key, 0, T0 / 60_000))
        .sum();
    assert_eq!(counted, entities as i64);
    assert_eq!(queues.len(), 0);
    stop.cancel();
    task.await.unwrap();
    (queues, health)
}

#[tokio::test(start_paused = true)]
async fn a_backlog_drains_in_calls_sized_to_answer_within_the_timeout() {
    // 10 µs an item: 20,000 items take 200 ms, twice the timeout. The calls settle at 4,000
    // (40 ms), and 100,000 new entities drain in about a second, none of them timing out.
    let (queues, health) = drain(100_000, 10_000, 2).await;
    let stats = &queues.stats;
    assert_eq!(stats.calls_failed.load(Ordering::Relaxed), 0);
    assert_eq!(stats.calls_resized.load(Ordering::Relaxed), 0);
    assert!(!health.is_degraded());
    assert_eq!(health.batch.get(), 4_000);
}

#[tokio::test(start_paused = true)]
async fn a_call_too_large_for_the_timeout_is_sent_again_smaller_and_degrades_nothing() {
    // 60 µs an item: the first call of 2,000 items takes 120 ms and times out (it ran, as
    // Redis runs a script whoever waits); sent again as 1,000 (60 ms: slow, so 750), every
    // later call answers in time. 30,000 entities drain in about 2.5 s.
    let (queues, health) = drain(30_000, 60_000, 3).await;
    let stats = &queues.stats;
    assert_eq!(stats.calls_failed.load(Ordering::Relaxed), 0);
    assert_eq!(stats.calls_resized.load(Ordering::Relaxed), 1);
    assert!(!health.is_degraded());
    assert_eq!(health.batch.get(), 750);
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
