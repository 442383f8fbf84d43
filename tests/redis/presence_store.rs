//! `presence.lua` (the RLQS streams each replica publishes per counter) against its in-memory
//! twin: the same random sequence of presence calls (several replicas, streams coming and
//! going, time moving past entries' expiry) gives the same sums from a real redis-server,
//! standalone and as a cluster, as from `MemoryStore`, which the simulator and the loop's
//! tests run on. And the data model as documented in `global/redis/presence.rs`.
use crate::common::redis::{RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::global::memory::MemoryStore;
use sluice::global::redis::{RedisOptions, RedisStore};
use sluice::global::{Others, Presence, Publish, ShardStore, Trip};

const NOW_MS: u64 = 1_700_000_040_000;
const TTL_MS: u64 = 3_000;

/// One call: ms after the previous call, a replica, then items `(entity, streams, demand in
/// thousandths of a request/s / 7: fractions that round)`.
type Call = (u64, u64, Vec<(u8, u32, u32)>);

fn calls() -> impl Strategy<Value = Vec<Call>> {
    let item = (0u8..4, prop_oneof![Just(0u32), 1u32..5], 0u32..100_000);
    // Steps up to 2 s with a TTL of 3 s: entries expire within a few calls of a quiet replica.
    // Round steps too, so that a call lands exactly on an entry's expiry now and then.
    let step = prop_oneof![0u64..2_000, Just(500), Just(1_000), Just(1_500)];
    let call = (step, 1u64..5, proptest::collection::vec(item, 1..5));
    proptest::collection::vec(call, 1..16)
}

fn presence((entity, streams, demand): (u8, u32, u32)) -> Presence {
    Presence {
        entity: u128::from(entity) << 100 | 0xbeef,
        streams,
        demand: f64::from(demand) / 7.0,
    }
}

/// Runs `calls` on `store` and on a fresh memory store, in order; the sums must agree.
fn same_as_memory<S: ShardStore>(rt: &tokio::runtime::Runtime, store: &S, calls: &[Call]) {
    let memory = MemoryStore::default();
    let mut now = NOW_MS;
    for (step, replica, items) in calls {
        now += step;
        let items: Vec<Presence> = items.iter().copied().map(presence).collect();
        let want = rt
            .block_on(memory.presence(*replica, &items, now, TTL_MS))
            .unwrap();
        let got = rt
            .block_on(store.round_trip(
                *replica,
                Trip {
                    publish: Some(Publish {
                        items: &items,
                        now_ms: now,
                        ttl_ms: TTL_MS,
                    }),
                    ..Trip::default()
                },
            ))
            .unwrap()
            .others;
        assert_eq!(
            want,
            got,
            "replica {replica} at +{} ms: {items:?}",
            now - NOW_MS
        );
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn opts(prefix: &str) -> RedisOptions {
    RedisOptions {
        prefix: prefix.into(),
        pool_size: 2,
        ..RedisOptions::default()
    }
}

#[test]
fn a_redis_shard_keeps_presence_as_the_memory_store_does() {
    let redis = RedisServer::start();
    let rt = runtime();
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0);
    runner
        .run(&calls(), |calls| {
            // Each case on its own keys; every other one with the scripts flushed (NOSCRIPT).
            n.set(n.get() + 1);
            let shard = RedisStore::new(&redis.url(), &opts(&format!("case{}:", n.get()))).unwrap();
            if n.get() % 2 == 0 {
                redis.cli(&["SCRIPT", "FLUSH"]);
            }
            same_as_memory(&rt, &shard, &calls);
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_redis_cluster_keeps_presence_as_the_memory_store_does() {
    let cluster = RedisCluster::start(3);
    let rt = runtime();
    let store = RedisStore::cluster(&cluster.seed_urls(), &opts("c:")).unwrap();
    // Entities in different slots, three replicas, one leaving, one going quiet past its TTL.
    let calls: Vec<Call> = vec![
        (0, 1, vec![(0, 2, 7_000), (1, 1, 700), (2, 3, 70)]),
        (10, 2, vec![(0, 1, 1_400), (2, 1, 7)]),
        (10, 3, vec![(0, 4, 3), (1, 2, 14_000)]),
        (1_000, 1, vec![(0, 2, 7_000), (1, 0, 0), (2, 3, 70)]),
        (1_500, 2, vec![(0, 1, 1_400), (1, 1, 1)]),
        (1_000, 1, vec![(0, 2, 7_000), (2, 3, 70)]),
        (10, 3, vec![(0, 0, 0), (1, 1, 1)]),
    ];
    same_as_memory(&rt, &store, &calls);
}

#[test]
fn the_data_model_is_one_hash_per_counter_with_a_field_per_replica() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = RedisStore::new(&redis.url(), &opts("p:")).unwrap();
    let it = |streams, demand| Presence {
        entity: 0xab,
        streams,
        demand,
    };
    let call = |replica, item, now| {
        rt.block_on(store.presence(replica, &[item], now, TTL_MS))
            .unwrap()[0]
    };
    assert_eq!(call(1, it(2, 10.5), NOW_MS), Others::default());
    assert_eq!(
        call(0x2a, it(1, 0.25), NOW_MS + 100),
        Others {
            streams: 2,
            demand: 10.5
        }
    );
    let key = "p:sluice:q1:{000000000000000000000000000000ab}";
    let field = |id| redis.cli(&["HGET", key, id]);
    assert_eq!(
        field("0000000000000001"),
        format!("2 10500 {}", NOW_MS + TTL_MS)
    );
    assert_eq!(
        field("000000000000002a"),
        format!("1 250 {}", NOW_MS + 100 + TTL_MS)
    );
    // The key lives as long as its longest-lived field (by the caller's clock).
    let pttl: i64 = redis.cli(&["PTTL", key]).parse().unwrap();
    assert!(
        pttl > TTL_MS as i64 - 1_000 && pttl <= TTL_MS as i64,
        "{pttl}"
    );
    // Leaving removes the field; an expired field is dropped by the next call on the key.
    call(1, it(0, 0.0), NOW_MS + 200);
    assert_eq!(field("0000000000000001"), "");
    assert_eq!(
        call(7, it(0, 0.0), NOW_MS + 100 + TTL_MS),
        Others::default()
    );
    assert_eq!(redis.cli(&["EXISTS", key]), "0");
}
