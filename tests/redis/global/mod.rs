//! Global mode against real Redis servers started by the tests (redis-server must be
//! installed; scripts/test.sh installs it): exactness of one replica, shards and Redis Cluster,
//! a fleet of processes sharing a limit, Redis faults, SIGTERM's final flush, clock offset.
//!
//! Here the in-process servers (exactness, shards, Cluster, faults, the key prefix, the kept
//! deltas' bound) and what the other files share; `fleet` runs `sluice` processes measured
//! against the simulator, `join` starts them together, `lost_keys` replaces their Redis with
//! an empty one, `security` reaches Redis with credentials and TLS.

use std::process::Command;
use std::time::Duration;

use crate::common::redis::{global_mode, sync_mode, RedisCluster, RedisServer};
use crate::common::{desc, free_port, http_async, wait_for_body, wait_until_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::global::ShardRouter;
use sluice::settings::Settings;

mod fleet;
mod join;
mod lost_keys;
mod refunds;
mod reset;
mod rlqs;
mod security;
mod small;

const RULES: &str = "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}\n";

fn req(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "g".into(),
        descriptors: vec![desc(&[(key, value)])],
        hits_addend: 0,
    }
}

async fn ask(s: &Server, key: &str, value: &str) -> RateLimitResponse {
    s.client()
        .await
        .should_rate_limit(req(key, value))
        .await
        .unwrap()
        .into_inner()
}

/// Every `sluice:` counter on a server, summed, and the keys.
fn counters(r: &RedisServer) -> (u64, Vec<String>) {
    let keys: Vec<String> = r
        .cli(&["--scan", "--pattern", "*sluice:v2:{*"])
        .lines()
        .map(str::to_string)
        .collect();
    let sum = keys.iter().map(|k| parts(&r.cli(&["HVALS", k]))).sum();
    (sum, keys)
}

/// A counter's value from its `HVALS` (one part per replica; key version 2).
fn parts(hvals: &str) -> u64 {
    let sum: i64 = hvals
        .lines()
        .map(|v| v.trim().parse::<i64>().unwrap())
        .sum();
    sum.max(0) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replica_is_exact_under_concurrency_and_redis_holds_every_hit() {
    let redis = RedisServer::start();
    // A key in the heartbeat's way: it fails every tick, and the syncs must not be resent.
    redis.cli(&["SET", "sluice:replicas", "in-the-way"]);
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 2)).await;
    let admitted = s
        .admitted_by_concurrent_clients(req("k", "shared"), 8, 40)
        .await;
    assert_eq!(
        admitted, 100,
        "one replica with Redis is as exact as local mode"
    );
    s.stop().await.unwrap(); // final flush
                             // Fixed windows count every hit, admitted or not, as the reference does: 320 in all.
    assert_eq!(counters(&redis).0, 320);
}

/// `n` hits of `key`=`value` through `s` (a look with 0), given back with `refund`: whether
/// over, and the status's remaining.
async fn status(s: &Server, key: &str, value: &str, n: u64, refund: bool) -> (bool, u32) {
    let mut r = req(key, value);
    r.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: n });
    r.descriptors[0].is_negative_hits = refund;
    let resp = s.client().await.should_rate_limit(r).await.unwrap();
    let st = &resp.into_inner().statuses[0];
    (st.code == 2, st.limit_remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_through_one_replica_reaches_the_others_count() {
    // Reserve, then settle, across two replicas: A reserves the whole day's 100; B reads 0 left.
    // A gives 40 back: B's next reads show 40 left. (B kept the largest count it had read, and
    // showed 0 left until the day ended.)
    let redis = RedisServer::start();
    let a = Server::start(RULES, global_mode(vec![redis.url()], false, 2)).await;
    // Before B starts: a replica that knows of another keeps a value it has not read to its
    // prior, half the limit (and 5 %) here.
    assert_eq!(status(&a, "k", "settle", 100, false).await, (false, 0));
    let b = Server::start(RULES, global_mode(vec![redis.url()], false, 2)).await;
    wait_until_async(10, "B reads the reservation", || async {
        status(&b, "k", "settle", 0, false).await.1 == 0
    })
    .await;
    status(&a, "k", "settle", 40, true).await;
    wait_until_async(10, "B reads the refund", || async {
        status(&b, "k", "settle", 0, false).await.1 == 40
    })
    .await;
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    assert_eq!(counters(&redis).0, 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquisitions_in_flight_reach_redis_released_from_the_oldest_minute_and_lapse() {
    // 4 in flight, a lease of a minute. 3 acquired; in the next minute one released (from
    // the first minute's count) and 2 acquired: 4 in flight. Two minutes on, the first
    // minute's 2 lapsed: 2 more fit. Redis holds each minute's acquisitions and releases.
    let rules = "domain: g\ndescriptors:\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: concurrency}\n";
    let redis = RedisServer::start();
    // The sync's counters are what this reads: a limit of 4 would be decided exactly.
    let s = Server::start(rules, sync_mode(vec![redis.url()], false, 2)).await;
    let acquire = |n| status(&s, "c", "t", n, false);
    // Each minute's counter in Redis, oldest first, once the sync sent them.
    let minutes = |want: &'static [u64]| {
        let redis = &redis;
        wait_until_async(10, "the sync", move || async move {
            let mut keys = counters(redis).1;
            keys.sort();
            let counts: Vec<u64> = keys
                .iter()
                .map(|k| parts(&redis.cli(&["HVALS", k])))
                .collect();
            counts == want
        })
    };
    for _ in 0..3 {
        assert!(!acquire(1).await.0);
    }
    minutes(&[3]).await;
    s.clock.set(crate::common::T0.plus_millis(70_000));
    status(&s, "c", "t", 1, true).await;
    assert_eq!(acquire(2).await, (false, 0));
    assert!(acquire(1).await.0, "4 in flight");
    // Time goes on within the minute: had the release's sync gone before the acquisitions,
    // theirs is due a tick later, which a clock standing still would never reach.
    s.clock.set(crate::common::T0.plus_millis(75_000));
    minutes(&[2, 2]).await;
    s.clock.set(crate::common::T0.plus_millis(120_000));
    assert_eq!(acquire(2).await, (false, 0), "the first minute's lapsed");
    assert!(acquire(1).await.0);
    s.stop().await.unwrap(); // the final flush
    minutes(&[2, 2, 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_slower_than_the_timeout_counts_every_hit_once() {
    // Every sync call times out (100 ms) while Redis holds its replies 300 ms, and runs in
    // Redis all the same; its hits go again with the next call. Stated parts count them once.
    let redis = RedisServer::start();
    let s = Server::start(RULES, |st| {
        global_mode(vec![redis.url()], false, 2)(st);
        st.sync.timeout = Duration::from_millis(100);
    })
    .await;
    let pauses: Vec<Command> = (0..8)
        .map(|_| {
            let mut c = redis.cli_command();
            c.args(["CLIENT", "PAUSE", "300", "ALL"]);
            c
        })
        .collect();
    let pauser = std::thread::spawn(move || {
        for mut pause in pauses {
            pause.output().unwrap();
            std::thread::sleep(Duration::from_millis(330));
        }
    });
    for _ in 0..70 {
        ask(&s, "k", "slow").await;
        tokio::time::sleep(Duration::from_millis(35)).await;
    }
    pauser.join().unwrap();
    // Redis answers in time again: the count settles at what was counted, once.
    wait_until_async(10, "Redis to hold the 70 hits", || async {
        counters(&redis).0 == 70
    })
    .await;
    let mut admitted = 0;
    for _ in 0..40 {
        admitted += usize::from(ask(&s, "k", "slow").await.overall_code == 1);
    }
    assert_eq!(admitted, 30, "the rest of the limit, no more, no less");
    s.stop().await.unwrap();
    assert_eq!(counters(&redis).0, 110);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_shards_each_hold_the_entities_routed_to_them() {
    let shards = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = shards.iter().map(|r| r.url()).collect();
    let s = Server::start(RULES, global_mode(urls.clone(), false, 2)).await;
    for v in 0..90 {
        assert_eq!(ask(&s, "k", &format!("user{v}")).await.overall_code, 1);
    }
    s.stop().await.unwrap();
    let router = ShardRouter::new(&urls);
    let mut total = 0;
    for (i, shard) in shards.iter().enumerate() {
        let (sum, keys) = counters(shard);
        assert!(!keys.is_empty(), "shard {i} got no entities");
        for k in &keys {
            let hex = k.split('{').nth(1).unwrap().split('}').next().unwrap();
            let entity = u128::from_str_radix(hex, 16).unwrap();
            assert_eq!(router.shard(entity), i, "{k} is on shard {i}");
        }
        total += sum;
    }
    assert_eq!(total, 90);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_holds_counts_on_the_slot_owners() {
    let cluster = RedisCluster::start(3);
    let s = Server::start(RULES, global_mode(cluster.seed_urls(), true, 2)).await;
    for v in 0..60 {
        ask(&s, "k", &format!("user{v}")).await;
    }
    ask(&s, "k", "user0").await;
    s.stop().await.unwrap();
    let mut total = 0;
    let mut nodes_used = 0;
    for node in &cluster.nodes {
        // A plain (non-cluster) scan on each master: keys live only where their slot is.
        let (sum, keys) = counters(node);
        for k in &keys {
            assert_eq!(cluster.node_for_key(k), node.port(), "{k}");
        }
        nodes_used += usize::from(!keys.is_empty());
        total += sum;
    }
    assert_eq!(total, 61);
    assert_eq!(nodes_used, 3, "60 entities spread over every master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_absent_at_start_then_killed_then_back() {
    // A port with no Redis behind it yet.
    let mut redis = RedisServer::start();
    redis.kill();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 2)).await;
    for _ in 0..5 {
        assert_eq!(
            ask(&s, "k", "a").await.overall_code,
            1,
            "answered from memory"
        );
    }
    let (status, _, ready) = http_async(s.http, "GET", "/readyz", "").await.unwrap();
    assert_eq!(
        status, 200,
        "Redis down does not make sluice unready: {ready}"
    );
    wait_for_body(s.http, "/readyz", "degraded").await;
    let (_, _, m) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        m.contains("sluice_redis_shard_degraded{shard=\"redis://127.0.0.1:"),
        "{m}"
    );

    // Redis comes up: the 5 hits kept during the outage are flushed.
    redis.restart();
    wait_for_body(s.http, "/readyz", ": ok").await;
    wait_redis(&redis, 5).await;

    // Killed under load and back: every request answered, nothing lost.
    redis.kill();
    for _ in 0..7 {
        assert_eq!(ask(&s, "k", "a").await.overall_code, 1);
    }
    // No persistence: Redis restarts empty, gets the 7 kept hits, and the 5 it had
    // acknowledged before, put back by the same sync.
    redis.restart();
    wait_redis(&redis, 12).await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_that_never_answered_is_not_called_ok() {
    // A loopback port with nothing behind it: the shard never answers.
    let url = format!("redis://127.0.0.1:{}", free_port());
    let s = Server::start(RULES, |s: &mut Settings| {
        global_mode(vec![url], false, 2)(s);
        s.sync_join_timeout = Duration::from_millis(300);
    })
    .await;
    // It started all the same, once the join gave up, and says so.
    let (_, _, ready) = http_async(s.http, "GET", "/readyz", "").await.unwrap();
    assert!(
        ready.contains(
            "fleet: live replicas: 1 (started before Redis answered: nothing within 300ms, "
        ),
        "{ready}"
    );
    assert_eq!(
        ask(&s, "k", "a").await.overall_code,
        1,
        "answered from memory"
    );
    wait_for_body(s.http, "/readyz", "degraded, not answered yet: ").await;
    let (status, _, ready) = http_async(s.http, "GET", "/readyz", "").await.unwrap();
    // Like a degraded shard, one not answered yet leaves sluice ready: it decides locally.
    assert_eq!(status, 200, "{ready}");
    assert!(!ready.contains(": ok"), "{ready}");
    s.stop().await.unwrap();
}

async fn wait_redis(r: &RedisServer, want: u64) {
    let what = format!("Redis to hold {want} hits");
    wait_until_async(30, &what, || std::future::ready(counters(r).0 == want)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_take_the_cache_key_prefix() {
    let redis = RedisServer::start();
    let url = redis.url();
    let s = Server::start(RULES, move |st| {
        global_mode(vec![url], false, 2)(st);
        st.redis.as_mut().unwrap().options.prefix = "tenant-a:".into();
    })
    .await;
    ask(&s, "k", "p").await;
    let mut key = String::new();
    wait_until_async(30, "the first hit's counter in Redis", || {
        key = redis.cli(&["--scan", "--pattern", "*{*"]);
        std::future::ready(!key.is_empty())
    })
    .await;
    assert!(
        key.starts_with("tenant-a:sluice:v2:{") && !key.contains('\n'),
        "{key}"
    );
    // So do the heartbeats.
    let others = redis.cli(&["--scan", "--pattern", "*replicas"]);
    assert_eq!(others.trim(), "tenant-a:sluice:replicas");
    // The expiry (two day-long windows) is set when the counter is created, and a later
    // write does not push it back.
    let pttl = || redis.cli(&["PTTL", &key]).parse::<i64>().unwrap();
    let first = pttl();
    assert!(
        (2 * 86_400_000 - 60_000..=2 * 86_400_000).contains(&first),
        "{first}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    ask(&s, "k", "p").await;
    s.stop().await.unwrap();
    assert_eq!(parts(&redis.cli(&["HVALS", &key])), 2);
    assert!(
        pttl() <= first - 250,
        "the expiry was reset: {first} then {}",
        pttl()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_shard_does_not_hold_up_the_others() {
    let live = RedisServer::start();
    let mut dead = RedisServer::start();
    dead.kill();
    let urls = vec![live.url(), dead.url()];
    let router = ShardRouter::new(&urls);
    let s = Server::start(RULES, global_mode(urls, false, 2)).await;
    for v in 0..40 {
        assert_eq!(ask(&s, "k", &format!("user{v}")).await.overall_code, 1);
    }
    wait_for_body(s.http, "/readyz", "degraded").await;
    // Every entity routed to the live shard reached it, while the other shard was down.
    let expected = (0..40)
        .filter(|v| {
            let entity = s_entity(&s, &format!("user{v}"));
            router.shard(entity) == 0
        })
        .count() as u64;
    assert!(expected > 5, "some entities route to the live shard");
    wait_redis(&live, expected).await;
    s.stop().await.unwrap();
}

/// The entity of `k=value` in RULES, as the server computes it.
fn s_entity(_s: &Server, value: &str) -> u128 {
    let set = sluice::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
    set.find("g", &[("k", value)]).unwrap().entity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bound_on_kept_deltas_is_counted_when_hit() {
    let mut redis = RedisServer::start();
    redis.kill();
    let url = redis.url();
    let s = Server::start(RULES, move |st| {
        global_mode(vec![url], false, 2)(st);
        st.sync_max_queued = 3;
    })
    .await;
    for v in 0..5 {
        assert_eq!(ask(&s, "k", &format!("u{v}")).await.overall_code, 1);
    }
    let (_, _, m) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(m.contains("sluice_sync_deltas_dropped_total 2"), "{m}");
    assert!(m.contains("sluice_sync_pending_entities 3"), "{m}");
    // The three kept entities reach Redis once it is back.
    redis.restart();
    wait_redis(&redis, 3).await;
    s.stop().await.unwrap();
}
