//! The Redis stores against the in-memory one: the same random sequence of sync calls (window
//! and bucket items mixed, several replicas) gives the same totals from a real redis-server,
//! standalone and as a cluster, as from `MemoryStore` — the store the simulator and the sync
//! tests run on. So what the simulator measures is what Redis does. The set of replicas the
//! heartbeats keep, as a joining replica reads it, and the store's generation they read, too.
use crate::common::redis::{RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::core::Part;
use sluice::global::memory::MemoryStore;
use sluice::global::redis::{RedisOptions, RedisStore};
use sluice::global::{Beat, Heartbeat, ResetRead, ShardStore, SyncItem, SyncOp, Trip};

const NOW_MS: u64 = 1_700_000_040_000;

/// One call: a replica, then items `(entity, is_bucket, delta, ms after NOW)`; a window's
/// delta is its stated part (hits, or refunds when negative).
type Call = (u64, Vec<(u8, bool, i64, u64)>);

fn item((entity, bucket, delta, at): (u8, bool, i64, u64)) -> SyncItem {
    let now = NOW_MS + at;
    let op = if bucket {
        // Even entities 10 a second, odd ones 3 a second (a token every 333,333,333 ns, not
        // a whole µs); burst 30: at most 60 owed.
        let interval_ns = if entity % 2 == 0 {
            100_000_000
        } else {
            333_333_333
        };
        SyncOp::Bucket {
            delta,
            // Some tokens counted, not spent: spent before the replica saw the bucket full.
            spend: delta - (at % 3) as i64,
            now_us: now * 1000,
            since_us: now.saturating_sub(7) * 1000,
            interval_ns,
            max_ahead_ns: 60 * interval_ns,
            floor_us: 0,
            ttl_ms: 60_000,
            // Now and then what an earlier call stated, as a late duplicate or a resend.
            stated: [(delta.max(0) + at as i64 % 50) as u32, (at % 7) as u32],
        }
    } else {
        let epoch = now / 60_000;
        SyncOp::Window {
            epochs: [epoch, epoch - 1],
            // Stated parts, not in order: a replica's later statement may hold less than an
            // earlier one (a late duplicate), and the store keeps the larger. Refunds often
            // past the count: those are kept out, once.
            parts: [
                Part {
                    hits: delta.max(0) as u64,
                    refunds: (-delta).max(0) as u64 + at % 23,
                },
                Part::default(),
            ],
            // Now and then a floor above the sum (a store that lost the counter), less its
            // refunds.
            floors: [at % 90, 0],
            ttl_ms: 120_000,
        }
    };
    SyncItem {
        entity: u128::from(entity),
        limit: 0,
        op,
    }
}

fn calls() -> impl Strategy<Value = Vec<Call>> {
    let it = (0u8..4, any::<bool>(), -3i64..40, 0u64..5_000);
    proptest::collection::vec((1u64..4, proptest::collection::vec(it, 1..6)), 1..12)
}

/// Runs `calls` on `store` and on a fresh memory store, in order; the totals must agree (the
/// bucket's `tat` as both floor it to the microsecond, from the same whole nanoseconds).
fn same_as_memory<S: ShardStore>(rt: &tokio::runtime::Runtime, store: &S, calls: &[Call]) {
    let memory = MemoryStore::default();
    for (replica, items) in calls {
        // Time only moves forward, as on a real clock.
        let mut items: Vec<SyncItem> = items.iter().copied().map(item).collect();
        items.sort_by_key(|i| match i.op {
            SyncOp::Bucket { now_us, .. } => now_us / 1000,
            SyncOp::Window { .. } => 0,
        });
        let want = rt.block_on(memory.sync(*replica, &items)).unwrap();
        let trip = Trip {
            items: &items,
            ..Trip::default()
        };
        let got = rt
            .block_on(store.round_trip(*replica, trip))
            .unwrap()
            .totals;
        for ((w, g), it) in want.iter().zip(&got).zip(&items) {
            assert_eq!(w, g, "{it:?}: memory {w:?}, redis {g:?}");
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_redis_shard_syncs_windows_and_buckets_as_the_memory_store_does() {
    let redis = RedisServer::start();
    let rt = runtime();
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0);
    runner
        .run(&calls(), |calls| {
            // Each case on its own keys: a prefix per case.
            n.set(n.get() + 1);
            let opts = RedisOptions {
                prefix: format!("case{}:", n.get()),
                pool_size: 2,
                ..RedisOptions::default()
            };
            let shard = RedisStore::new(&redis.url(), &opts).unwrap();
            // Every other case starts with the scripts flushed: the NOSCRIPT path resends
            // only what was not applied.
            if n.get() % 2 == 0 {
                redis.cli(&["SCRIPT", "FLUSH"]);
            }
            same_as_memory(&rt, &shard, &calls);
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_redis_cluster_syncs_buckets_as_the_memory_store_does() {
    let cluster = RedisCluster::start(3);
    let rt = runtime();
    let opts = RedisOptions {
        prefix: "c:".into(),
        pool_size: 2,
        ..RedisOptions::default()
    };
    let store = RedisStore::cluster(&cluster.seed_urls(), &opts).unwrap();
    let calls: Vec<Call> = vec![
        (
            1,
            vec![(0, true, 25, 0), (1, false, 3, 0), (2, true, 5, 10)],
        ),
        (2, vec![(0, true, 10, 20), (2, true, -2, 30)]),
        (1, vec![(0, true, 0, 1_000), (1, false, 0, 1_000)]),
    ];
    same_as_memory(&rt, &store, &calls);
    same_replicas_as_memory(&rt, &store);
}

/// A heartbeat of `replica` at `now_ms`, offering `now_ms` as the store's generation.
fn beat(replica: u64, now_ms: u64, leaving: bool) -> Heartbeat {
    Heartbeat {
        replica,
        now_ms,
        ttl_ms: 8_000,
        leaving,
        new_generation: now_ms,
        resets: ResetRead::Skip,
    }
}

/// Heartbeats of three replicas (one leaving, one refreshed) on `store` and on the memory
/// store: both answer the same live counts and generation (the first heartbeat's), and list
/// the same members with the times their last heartbeats stated, which a joining replica
/// watches change (`global/join.rs`).
fn same_replicas_as_memory<S: ShardStore>(rt: &tokio::runtime::Runtime, store: &S) {
    let memory = MemoryStore::default();
    let beats = [
        beat(0xa1, NOW_MS, false),
        beat(0xb2, NOW_MS + 5, false),
        beat(u64::MAX, NOW_MS + 7, false),
        beat(0xb2, NOW_MS + 1_000, false),
        beat(0xa1, NOW_MS + 1_001, true),
    ];
    for b in &beats {
        let trip = Trip {
            beat: Some(b),
            ..Trip::default()
        };
        let (redis, mem) = rt.block_on(async {
            (
                store.round_trip(b.replica, trip).await,
                memory.heartbeat(b).await,
            )
        });
        assert_eq!(redis.unwrap().beat, Some(mem.unwrap()));
    }
    assert_eq!(*memory.generation.lock(), Some(NOW_MS));
    let mut listed = rt.block_on(store.replicas()).unwrap();
    listed.sort_unstable();
    assert_eq!(listed, vec![(0xb2, NOW_MS + 1_000), (u64::MAX, NOW_MS + 7)]);
    assert_eq!(listed, rt.block_on(memory.replicas()).unwrap());
}

#[test]
fn the_set_of_replicas_reads_as_the_memory_store_has_it() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    same_replicas_as_memory(&runtime(), &store);
}

#[test]
fn a_redis_that_lost_its_keys_answers_a_new_generation_as_the_memory_store_does() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let memory = MemoryStore::default();
    let both = |b: Heartbeat| {
        let (got, want) =
            rt.block_on(async { (store.heartbeat(&b).await, memory.heartbeat(&b).await) });
        let want = want.unwrap();
        assert_eq!(got.unwrap(), want);
        want
    };
    let generation = |b: Beat| b.generation.unwrap();
    assert_eq!(generation(both(beat(1, NOW_MS, false))), NOW_MS);
    assert_eq!(generation(both(beat(2, NOW_MS + 5, false))), NOW_MS);
    // Kept for good: counters expire, the generation does not.
    assert_eq!(redis.cli(&["PTTL", "sluice:generation"]), "-1");
    // Lost with the rest: the next heartbeat's offer is the new one, a leaving one's too.
    redis.cli(&["FLUSHALL"]);
    memory.flush_all();
    // (`flush_all` keeps the heartbeats, as the simulator's restart wants; Redis lost them.)
    memory.replicas.lock().clear();
    assert_eq!(generation(both(beat(2, NOW_MS + 9, true))), NOW_MS + 9);
    assert_eq!(generation(both(beat(1, NOW_MS + 20, false))), NOW_MS + 9);
    // A key of another type in its place is left alone: no generation, the heartbeat stands.
    redis.cli(&["DEL", "sluice:generation"]);
    redis.cli(&["HSET", "sluice:generation", "f", "v"]);
    let got = rt.block_on(store.heartbeat(&beat(1, NOW_MS + 30, false)));
    assert_eq!(
        got.unwrap(),
        Beat {
            live: 1,
            generation: None,
            resets: None
        }
    );
    assert_eq!(redis.cli(&["HGET", "sluice:generation", "f"]), "v");
}

#[test]
fn a_bucket_lost_by_redis_is_restored_to_what_the_replica_read() {
    let redis = RedisServer::start();
    let rt = runtime();
    let shard = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let spend = |delta, floor_us| SyncItem {
        entity: 9,
        limit: 0,
        op: SyncOp::Bucket {
            delta,
            spend: delta,
            now_us: NOW_MS * 1000,
            since_us: NOW_MS * 1000,
            interval_ns: 100_000_000,
            max_ahead_ns: 6_000_000_000,
            floor_us,
            ttl_ms: 60_000,
            stated: [delta as u32, 0],
        },
    };
    let [tat, spent] = rt.block_on(shard.sync(1, &[spend(30, 0)])).unwrap()[0];
    assert_eq!((tat, spent), (NOW_MS * 1000 + 3_000_000, 30));
    redis.cli(&["FLUSHALL"]);
    // A read carrying the tat last read brings the bucket back (its running count restarts).
    let [tat2, spent2] = rt.block_on(shard.sync(1, &[spend(0, tat)])).unwrap()[0];
    assert_eq!((tat2, spent2), (tat, 0));
    let key = format!("sluice:b1:{{{:032x}}}:0", 9);
    assert_eq!(redis.cli(&["HEXISTS", &key, "t"]), "1");
    let ttl: i64 = redis.cli(&["PTTL", &key]).parse().unwrap();
    assert!(
        ttl > 60_000 && ttl <= 63_000,
        "kept until full plus a minute: {ttl}"
    );
}

#[test]
fn a_window_reads_its_refunds_at_once_and_a_lost_one_reads_its_floor_less_its_refunds() {
    let redis = RedisServer::start();
    let rt = runtime();
    let shard = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let memory = MemoryStore::default();
    let epoch = NOW_MS / 60_000;
    let state = |hits, refunds, floor| SyncItem {
        entity: 7,
        limit: 0,
        op: SyncOp::Window {
            epochs: [epoch, epoch - 1],
            parts: [Part { hits, refunds }, Part::default()],
            floors: [floor, 0],
            ttl_ms: 120_000,
        },
    };
    let both = |replica, it: SyncItem| {
        let want = rt.block_on(memory.sync(replica, &[it])).unwrap()[0];
        let got = rt.block_on(shard.sync(replica, &[it])).unwrap()[0];
        assert_eq!(got, want, "redis and memory");
        got[0]
    };
    // Replica 1 reserves 100; replica 2 reads it (floor 0: nothing read before).
    assert_eq!(both(1, state(100, 0, 0)), 100);
    assert_eq!(both(2, state(0, 0, 0)), 100);
    // 1 gives 40 back: replica 2, which last read 100, reads 60, not 100.
    assert_eq!(both(1, state(100, 40, 100)), 60);
    assert_eq!(both(2, state(0, 0, 100)), 60);
    // The stores lose the counter: a read answers the floor (60) less the refunds they hold
    // (none yet), then less the 40 replica 1 restates with its part: 60, not 0 or 20.
    redis.cli(&["FLUSHALL"]);
    let memory_lost = MemoryStore::default();
    let lost = rt
        .block_on(memory_lost.sync(2, &[state(0, 0, 60)]))
        .unwrap()[0];
    assert_eq!(
        rt.block_on(shard.sync(2, &[state(0, 0, 60)])).unwrap()[0],
        lost
    );
    assert_eq!(lost[0], 60);
    let restated = rt
        .block_on(memory_lost.sync(1, &[state(100, 40, 60)]))
        .unwrap()[0];
    assert_eq!(
        rt.block_on(shard.sync(1, &[state(100, 40, 60)])).unwrap()[0],
        restated
    );
    assert_eq!(restated[0], 60);
}
