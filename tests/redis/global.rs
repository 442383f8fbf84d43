//! Global mode against real Redis servers started by the tests (redis-server must be
//! installed; scripts/test.sh installs it): exactness of one replica, shards and Redis Cluster,
//! a fleet of processes sharing a limit, Redis faults, SIGTERM's final flush, clock offset.

use std::process::Command;
use std::time::Duration;

use crate::common::procs::{grpc_addr, query, spawn_sluice, wait_live, Proc, MEASURING};
use crate::common::redis::{global_mode, RedisCluster, RedisServer, RedisTls};
use crate::common::{
    desc, free_port, http, http_async, wait_for_body, wait_until, wait_until_async, Server,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::core::{Algorithm, Limit};
use sluice::global::ShardRouter;
use sluice::sim::{self, Load, Scenario};
use tokio::time::Instant;

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
    let s = Server::start(RULES, global_mode(vec![url], false, 2)).await;
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

#[test]
fn a_fleet_of_three_processes_shares_one_limit() {
    let _measuring = MEASURING.blocking_lock();
    // The bound comes from the simulator (the production request path and sync task on
    // simulated time), run on this test's setting: 3 replicas, a limit of 60 in a fixed
    // window, a 100 ms tick (sync interval 2 s), ~1 ms round trip, 240 hits (4×) spread
    // evenly over 3 s. The test uses a day-long window so no boundary falls inside it;
    // the simulator uses a minute, which behaves the same within its first 3 s.
    let scenario = processes(3, 60, 100, (3_000, 80.0), 11);
    let predicted = sim::run(&scenario).sluice[0].admitted as usize;
    assert!(
        (60..=63).contains(&predicted),
        "the simulator predicts {predicted}"
    );

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES.replace("100", "60")).unwrap();
    let fleet = fleet_of(3, dir.path(), &redis, &[("SYNC_INTERVAL", "2s")]);
    let mut admitted = 0;
    for i in 0..240 {
        let r = query(&fleet[i % 3], "shared");
        admitted += usize::from(r["overallCode"] == "OK");
        std::thread::sleep(Duration::from_millis(12));
    }
    // Tolerance: the prediction ± 5. Real processes add what the simulator does not model
    // (scheduling delays, HTTP latency, tick phases), worth a few hits at this rate; without
    // sync the fleet would admit 180, and a fleet that stopped early would fall below 55.
    assert!(
        admitted + 5 >= predicted && admitted <= predicted + 5,
        "admitted {admitted}, simulator predicts {predicted}, limit 60 across 3 replicas"
    );
}

#[test]
fn a_redis_that_restarts_empty_gets_the_fleets_count_back() {
    let _measuring = MEASURING.blocking_lock();
    // 3 replicas, a limit of 300 in a fixed window: 220 hits acknowledged, Redis killed and
    // restarted empty on the same port, then 400 more. The bound comes from the simulator on
    // this setting (as in the test above): a hit every 12 ms spread over the replicas, 220
    // of them, the store restarting empty in the pause, 400 more.
    let load = |from_ms, until_ms| Load {
        from_ms,
        until_ms,
        times_limit: 60_000.0 / 12.0 / 300.0,
        hot_share: None,
    };
    let scenario = Scenario {
        name: "3 processes, Redis restarts",
        nodes: 3,
        limit: Limit {
            requests_per_unit: 300,
            window_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        },
        tick_ms: 100,
        rtt_ms: 1,
        loads: vec![load(0, 220 * 12), load(5_000, 5_000 + 400 * 12)],
        outage: None,
        restart_at_ms: Some(4_000),
        departure: None,
        windows: 1,
        seed: 12,
        alternate: false,
        phases: None,
        strict: false,
    };
    let predicted = sim::run(&scenario).sluice[0].admitted as usize;
    assert!(
        (297..=306).contains(&predicted),
        "the simulator predicts {predicted}"
    );

    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES.replace("100", "300")).unwrap();
    let fleet = fleet_of(3, dir.path(), &redis, &[("SYNC_INTERVAL", "2s")]);
    let mut admitted = 0;
    let mut send = |hits: usize| {
        for i in 0..hits {
            let r = query(&fleet[i % 3], "restart");
            admitted += usize::from(r["overallCode"] == "OK");
            std::thread::sleep(Duration::from_millis(12));
        }
    };
    send(220);
    wait_until(30, "220 hits in Redis", || counters(&redis).0 == 220);
    redis.restart(); // no persistence: back empty, on the same port
    assert_eq!(counters(&redis).0, 0);
    send(400);
    // Tolerance: the prediction ± 6, as for the fleet above (measured: 299 and 301 for a
    // prediction of 301), so at most 1.04× the limit. Before key version 2 the restart lost
    // the 220 and this fleet admitted 523 (the simulator, then, predicted 522).
    assert!(
        admitted + 6 >= predicted && admitted <= predicted + 6 && admitted <= 312,
        "admitted {admitted}, simulator predicts {predicted}, limit 300 across 3 replicas"
    );
}

/// A fleet test's scenario: a fixed window of `rpu` a minute, `load` = (until ms, × limit).
fn processes(nodes: usize, rpu: u32, tick_ms: u64, load: (u64, f64), seed: u64) -> Scenario {
    let (until_ms, times_limit) = load;
    Scenario {
        name: "processes",
        nodes,
        limit: Limit {
            requests_per_unit: rpu,
            window_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        },
        tick_ms,
        rtt_ms: 1,
        loads: vec![Load {
            from_ms: 0,
            until_ms,
            times_limit,
            hot_share: None,
        }],
        outage: None,
        restart_at_ms: None,
        departure: None,
        windows: 1,
        seed,
        alternate: false,
        phases: None,
        strict: false,
    }
}

/// Starts `n` processes on `redis`; waits until each one's heartbeats count all of them.
fn fleet_of(
    n: u32,
    rules: &std::path::Path,
    redis: &RedisServer,
    env: &[(&str, &str)],
) -> Vec<Proc> {
    let fleet: Vec<Proc> = (0..n)
        .map(|_| spawn_sluice(rules, &redis.url(), env))
        .collect();
    fleet.iter().for_each(|p| wait_live(p, n));
    fleet
}

#[test]
fn a_burst_on_a_cold_entity_across_four_processes_admits_what_the_simulator_predicts() {
    let _measuring = MEASURING.blocking_lock();
    // The simulator on this test's setting: 4 replicas, a limit of 40 in a fixed window, a
    // 1 s tick, ~1 ms round trip, 80 hits (2×) on a cold entity within 100 ms. Each replica
    // keeps to its prior (1.05 × 40 / 4 = 10, too small for burst reads: `core/prior.rs`)
    // until its first reply is a tick old, so the fleet admits about the limit; before the
    // prior, each admitted its 20 (2.0×).
    let predicted: Vec<usize> = (1..=6)
        .map(|seed| processes(4, 40, 1_000, (100, 2.0 * 600.0), seed))
        .map(|s| sim::run(&s).sluice[0].admitted as usize)
        .collect();
    let (lo, hi) = (predicted.iter().min(), predicted.iter().max());
    let (lo, hi) = (*lo.unwrap(), *hi.unwrap());
    assert!(hi <= 44, "the simulator predicts {predicted:?}");

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES.replace("100", "40")).unwrap();
    let env = [("SYNC_TICK", "1s"), ("SYNC_INTERVAL", "2s")];
    let fleet = fleet_of(4, dir.path(), &redis, &env);
    let ok = |p: &Proc| {
        // 20 hits on each replica at once, a client thread each: well within a tick.
        (0..20)
            .filter(|_| query(p, "burst")["overallCode"] == "OK")
            .count()
    };
    let admitted: usize = std::thread::scope(|sc| {
        let clients: Vec<_> = fleet.iter().map(|p| sc.spawn(move || ok(p))).collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    // Tolerance: the simulator's range over six seeds ± 2 (it lands hits at random, this test
    // evenly; real processes add scheduling and HTTP delays). Without the prior: 80.
    assert!(
        admitted + 2 >= lo && admitted <= hi + 2,
        "admitted {admitted}, simulator predicts {predicted:?}, limit 40 across 4 replicas"
    );
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

#[test]
fn an_acl_user_authenticates_with_user_and_password() {
    // The default user is off, so only alice's credentials get in.
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "off",
        "--user",
        "alice",
        "on",
        ">alice-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let port = redis.port();
    // As REDIS_AUTH=user:password, and as credentials in the URL.
    let via_env = spawn_sluice(
        dir.path(),
        &redis.url(),
        &[("REDIS_AUTH", "alice:alice-pw")],
    );
    let in_url = spawn_sluice(
        dir.path(),
        &format!("redis://alice:alice-pw@127.0.0.1:{port}"),
        &[],
    );
    query(&via_env, "acl");
    query(&in_url, "acl");
    let as_alice = |args: &[&str]| {
        let mut c = redis.cli_command();
        c.args(["--user", "alice", "--pass", "alice-pw", "--no-auth-warning"])
            .args(args);
        String::from_utf8(c.output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string()
    };
    wait_until(30, "both replicas' hits in Redis", || {
        let keys = as_alice(&["--scan"]);
        keys.lines().any(|k| parts(&as_alice(&["HVALS", k])) == 2)
    });
    for p in [&via_env, &in_url] {
        let (_, _, ready) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
        assert!(
            ready.contains(": ok") && !ready.contains("alice-pw"),
            "{ready}"
        );
    }
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

#[test]
fn sigterm_flushes_every_counted_hit_for_the_others_to_see() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    // A tick of an hour: only the cold entity's early round trip (its first hit or two)
    // reaches Redis before the shutdown's final flush.
    let a = spawn_sluice(
        dir.path(),
        &redis.url(),
        &[("SYNC_TICK", "1h"), ("SYNC_INTERVAL", "1h")],
    );
    for _ in 0..30 {
        assert_eq!(query(&a, "flush")["overallCode"], "OK");
    }
    let early = counters(&redis).0;
    assert!(
        (1..=2).contains(&early),
        "{early} hits synced before shutdown"
    );
    // Another replica, running: the heartbeats count two.
    let b = spawn_sluice(dir.path(), &redis.url(), &[]);
    wait_live(&b, 2);
    let mut a = a;
    let status = Command::new("kill")
        .args(["-TERM", &a.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_until(15, "sluice exit", || a.child.try_wait().unwrap().is_some());
    assert_eq!(counters(&redis).0, 30, "the final flush sent every hit");
    // ...and removed A's heartbeat: B counts one at its next tick, not after A's TTL (3 h).
    wait_live(&b, 1);
    // B sees A's hits: 70 left of 100.
    query(&b, "flush"); // a first look; the fleet's count arrives with the next tick
    wait_until(30, "replica b to learn the count", || {
        let r = http(b.http, "POST", "/json", r#"{"domain":"g","descriptors":[{"entries":[{"key":"k","value":"flush"}],"hitsAddend":0}]}"#, &[]).unwrap().2;
        r.contains(r#""limitRemaining":69"#)
    });
}

#[test]
fn a_replica_with_a_skewed_clock_shares_the_fleets_windows() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("r.yaml"),
        "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}\n",
    )
    .unwrap();
    let honest = spawn_sluice(dir.path(), &redis.url(), &[]);
    let skewed = spawn_sluice(dir.path(), &redis.url(), &[("SLUICE_CLOCK_SKEW", "25s")]);
    let reset = |p: &Proc| -> i64 {
        let r = query(p, "t");
        r["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .trim_end_matches('s')
            .parse()
            .unwrap()
    };
    // Both replicas see the same window end, within the time between the two calls (plus
    // the rounding to whole seconds); uncorrected, the skewed one would be 25 s off. A pair
    // is asked again until both answers come within 2 s, so a stalled machine cannot pass
    // for a skewed clock; the allowance is then what that pair actually took.
    let mut pair = (0, 0, Duration::ZERO);
    wait_until(
        60,
        "both replicas answering within 2 s of each other",
        || {
            let started = Instant::now();
            let (a, b) = (reset(&honest), reset(&skewed));
            pair = (a, b, started.elapsed());
            pair.2 < Duration::from_secs(2)
        },
    );
    let (a, b, took) = pair;
    let allowed = 1 + took.as_secs_f64().ceil() as i64;
    let diff = (a - b).rem_euclid(60).min((b - a).rem_euclid(60));
    assert!(
        diff <= allowed,
        "honest {a}s, skewed {b}s, asked {took:?} apart"
    );
}

#[test]
fn tls_and_auth_work_and_the_secret_stays_out_of_logs_and_endpoints() {
    const SECRET: &str = "s3cret-Pw";
    let tls = RedisTls::start_with(&["--requirepass", SECRET]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let ca = tls.ca_cert.display().to_string();
    let p = spawn_sluice(
        dir.path(),
        &format!("127.0.0.1:{}", tls.port()),
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", SECRET),
            ("SSL_CERT_FILE", &ca),
        ],
    );
    for _ in 0..4 {
        assert_eq!(query(&p, "tls")["overallCode"], "OK");
    }
    let mut p = p;
    wait_until(30, "the hits to reach Redis over TLS", || {
        let keys = tls.cli(&["--scan", "--pattern", "*sluice:v2:{*"]);
        keys.lines()
            .map(|k| parts(&tls.cli(&["HVALS", k])))
            .sum::<u64>()
            == 4
    });
    for path in ["/readyz", "/metrics", "/rlconfig", "/rlconfig/status"] {
        let (_, _, body) = http(p.http, "GET", path, "", &[]).unwrap();
        assert!(!body.contains(SECRET), "{path} shows the Redis password");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    wait_until(15, "sluice exit", || p.child.try_wait().unwrap().is_some());
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(log.contains("global mode"), "debug log written: {log}");
    assert!(!log.contains(SECRET), "the log shows the Redis password");
}

/// Waits until the process's `/readyz` names a degraded shard.
fn wait_degraded(p: &Proc) {
    wait_until(30, "the shard to be degraded", || {
        http(p.http, "GET", "/readyz", "", &[])
            .unwrap()
            .2
            .contains("degraded")
    });
}

#[test]
fn a_wrong_password_keeps_the_shard_degraded_but_the_service_answering() {
    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let p = spawn_sluice(dir.path(), &redis.url(), &[("REDIS_AUTH", "wrong")]);
    assert_eq!(query(&p, "x")["overallCode"], "OK");
    wait_degraded(&p);
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("wrong"), "{body}");
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

/// `REDIS_TLS_*` as Envoy Gateway sets them for a Redis backend with a TLS certificateRef:
/// a client certificate to a Redis that requires one, verified against a CA of its own (not
/// the system's roots: the process has no SSL_CERT_FILE). The per-second Redis, on the same
/// server here, gets them too: its shard hears the heartbeats, so it would be degraded
/// without them.
const MTLS_RULES: &str = "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}\n  - key: e\n    rate_limit: {unit: minute, requests_per_unit: 2, exact: true}\n";

/// Three hits on the exact rule `e` of `MTLS_RULES`: the overall codes.
fn exact_hits(p: &Proc) -> Vec<String> {
    let body = r#"{"domain":"g","descriptors":[{"entries":[{"key":"e","value":"x"}]}]}"#;
    (0..3)
        .map(|_| {
            let (_, _, text) = http(p.http, "POST", "/json", body, &[]).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["overallCode"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

#[test]
fn a_client_certificate_and_a_ca_of_its_own_reach_a_redis_that_requires_them() {
    let tls = RedisTls::start_mtls(&[]);
    let (cert, key) = tls.client.clone().expect("mtls client certificate");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let ca = tls.ca_cert.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), MTLS_RULES).unwrap();
    let addr = format!("127.0.0.1:{}", tls.port());
    let mut p = spawn_sluice(
        dir.path(),
        &addr,
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("REDIS_TLS_CACERT", &ca),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &addr),
            ("REDIS_PERSECOND_TLS", "true"),
        ],
    );
    for _ in 0..4 {
        assert_eq!(query(&p, "mtls")["overallCode"], "OK");
    }
    wait_until(30, "the hits to reach Redis over mTLS", || {
        counters(&tls.server).0 == 4
    });
    wait_live(&p, 1);
    // Both shards up: a first call may time out on a busy machine (a TLS handshake in a
    // debug build), and the shard answers at its next probe.
    wait_until(
        30,
        "both shards to be up",
        || matches!(http(p.http, "GET", "/readyz", "", &[]), Ok((200, _, body)) if !body.contains("degraded")),
    );
    // The exact path: its own pool, the same certificates; its count is in Redis.
    assert_eq!(exact_hits(&p), ["OK", "OK", "OVER_LIMIT"]);
    assert!(
        tls.cli(&["--scan", "--pattern", "*sluice:x:{*"])
            .lines()
            .count()
            >= 1,
        "the exact rule's counter is in Redis"
    );
    let pem = std::fs::read_to_string(&key).unwrap();
    let secret = pem.lines().nth(1).expect("a PEM body line");
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    wait_until(15, "sluice exit", || p.child.try_wait().unwrap().is_some());
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(!log.contains(secret), "the log shows the client key");
}

/// The same server without a client certificate (the CA alone): the handshake is refused,
/// the shard is degraded in /readyz, decisions go on from memory and nothing is written.
#[test]
fn without_the_client_certificate_the_shard_is_degraded_and_nothing_is_written() {
    let tls = RedisTls::start_mtls(&[]);
    let ca = tls.ca_cert.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let p = spawn_sluice(
        dir.path(),
        &format!("127.0.0.1:{}", tls.port()),
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)],
    );
    for _ in 0..3 {
        assert_eq!(query(&p, "nocert")["overallCode"], "OK");
    }
    wait_degraded(&p);
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(counters(&tls.server), (0, vec![]), "nothing reached Redis");
}

/// A client certificate file that is not there stops the start with an error naming the
/// variable and the file.
#[test]
fn a_missing_redis_client_certificate_stops_the_start_naming_it() {
    let tls = RedisTls::start_mtls(&[]);
    let (_, key) = tls.client.clone().expect("mtls client certificate");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let missing = dir.path().join("redis-certs").join("tls.crt");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .env_clear()
        .args(["serve", "--config"])
        .arg(dir.path())
        .args([
            "--grpc-addr",
            &format!("127.0.0.1:{}", free_port()),
            "--http-addr",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .env("REDIS_URL", format!("127.0.0.1:{}", tls.port()))
        .env("REDIS_TLS", "true")
        .env("REDIS_TLS_CLIENT_CERT", &missing)
        .env("REDIS_TLS_CLIENT_KEY", &key)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "sluice started without its certificate"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("REDIS_TLS_CLIENT_CERT"))
        .unwrap_or_else(|| panic!("no error names REDIS_TLS_CLIENT_CERT: {stderr}"));
    assert!(line.contains(&missing.display().to_string()), "{line}");
}

/// 4 hits on `value` (a synced rule) reach `server`, an exact rule counts there too, and no
/// shard is degraded: the mTLS tests' common proof that the certificates got everywhere.
fn counts_reach(p: &Proc, value: &str, server: &RedisServer) {
    for _ in 0..4 {
        assert_eq!(query(p, value)["overallCode"], "OK");
    }
    wait_until(30, "the hits to reach Redis over mTLS", || {
        counters(server).0 == 4
    });
    assert_eq!(exact_hits(p), ["OK", "OK", "OVER_LIMIT"]);
    let exact_keys = server.cli(&["--scan", "--pattern", "*sluice:x:{*"]);
    assert!(
        exact_keys.lines().count() >= 1,
        "the exact rule's counter is in Redis"
    );
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("degraded"), "{body}");
}

/// A Redis Cluster over TLS that requires client certificates: the cluster client gets the
/// certificate and CA too (for the nodes CLUSTER SLOTS names), in the sync and exact paths.
#[test]
fn a_tls_cluster_takes_the_client_certificate_and_ca() {
    let cluster = RedisCluster::start_one_mtls();
    let (ca, client) = cluster.nodes[0].tls_files().expect("a TLS node");
    let (cert, key) = client.expect("a client certificate");
    let s = |p: &std::path::Path| p.display().to_string();
    let (ca, cert, key) = (s(&ca), s(&cert), s(&key));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), MTLS_RULES).unwrap();
    let p = spawn_sluice(
        dir.path(),
        &format!("127.0.0.1:{}", cluster.nodes[0].port()),
        &[
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("REDIS_TLS_CACERT", &ca),
        ],
    );
    counts_reach(&p, "cluster-mtls", &cluster.nodes[0]);
}

/// Sentinel over TLS, every server requiring client certificates: the sentinels and the
/// master they name both get the certificate and CA, in the sync and exact paths.
#[test]
fn tls_sentinels_and_their_master_take_the_client_certificate_and_ca() {
    let master = RedisTls::start_mtls(&[]);
    let sentinel = RedisServer::start_sentinel_tls("m", &master.server);
    let (cert, key) = master.client.clone().expect("a client certificate");
    let s = |p: &std::path::Path| p.display().to_string();
    let (ca, cert, key) = (s(&master.ca_cert), s(&cert), s(&key));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), MTLS_RULES).unwrap();
    let p = spawn_sluice(
        dir.path(),
        &format!("m,127.0.0.1:{}", sentinel.port()),
        &[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("REDIS_TLS_CACERT", &ca),
        ],
    );
    counts_reach(&p, "sentinel-mtls", &master.server);
}

/// A Redis whose certificate names another host: refused (degraded, nothing written) until
/// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, which still verifies the chain: with another CA the
/// shard stays degraded.
#[test]
fn skipping_hostname_verification_still_verifies_the_chain() {
    let tls = RedisTls::start_named("DNS:redis.invalid");
    let other = RedisTls::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let addr = format!("127.0.0.1:{}", tls.port());
    let run = |ca: &std::path::Path, skip: &str| {
        let ca = ca.display().to_string();
        spawn_sluice(
            dir.path(),
            &addr,
            &[
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CACERT", &ca),
                ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", skip),
            ],
        )
    };
    let degraded = |p: &Proc| {
        assert_eq!(query(p, "named")["overallCode"], "OK");
        wait_degraded(p);
    };
    // The name is checked by default.
    degraded(&run(&tls.ca_cert, "false"));
    // Skipping the name does not skip the chain: another CA is still refused.
    degraded(&run(&other.ca_cert, "true"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counters(&tls.server).0, 0, "nothing written while refused");
    let p = run(&tls.ca_cert, "true");
    for _ in 0..3 {
        assert_eq!(query(&p, "named")["overallCode"], "OK");
    }
    wait_until(30, "the hits to reach Redis despite the name", || {
        counters(&tls.server).0 >= 3
    });
}

/// The rules of the surge at the edge: 600 an hour on `k`, `strict` by default, and on `l`
/// with `strict: false`.
const EDGE_RULES: &str = "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 600}\n  - key: l\n    rate_limit: {unit: hour, requests_per_unit: 600, strict: false}\n";

/// Each replica's tick phase (ms within the 1 s tick, in Redis time): the score of its last
/// heartbeat, whose member is the replica id its log names.
fn tick_phases(fleet: &[Proc], redis: &RedisServer) -> Vec<u64> {
    let beats = redis.cli(&["ZRANGE", "sluice:replicas", "0", "-1", "WITHSCORES"]);
    let beats: Vec<&str> = beats.lines().map(str::trim).collect();
    fleet
        .iter()
        .map(|p| {
            let log = std::fs::read_to_string(p.log.path()).unwrap();
            let id = log
                .split("replica id replica=\"")
                .nth(1)
                .and_then(|rest| rest.get(..16))
                .unwrap_or_else(|| panic!("no replica id in the log:\n{log}"));
            let at = beats.iter().position(|m| *m == id).expect("its heartbeat");
            beats[at + 1].parse::<u64>().unwrap() % 1_000
        })
        .collect()
}

/// Redis `TIME`, in ms.
fn redis_now_ms(redis: &RedisServer) -> u64 {
    let t = redis.cli(&["TIME"]);
    let mut parts = t.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let (s, us) = (parts.next().unwrap(), parts.next().unwrap());
    s * 1_000 + us / 1_000
}

/// A surge's traffic at the edge: `count` hits of `key=value`, one a millisecond of real
/// time from `start`, in turn to each replica of `fleet` (gRPC, each request on a task of
/// its own, so a slow answer never delays the next). Returns the hits admitted.
async fn surge_at_the_edge(
    fleet: &[Proc],
    start: Instant,
    (key, value): (&str, &str),
    count: usize,
) -> usize {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut clients = Vec::new();
    for p in fleet {
        let c = RateLimitServiceClient::connect(format!("http://{}", grpc_addr(p)));
        clients.push(c.await.unwrap());
    }
    let request = RateLimitRequest {
        domain: "g".into(),
        descriptors: vec![desc(&[(key, value)])],
        hits_addend: 0,
    };
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_millis(i as u64)).await;
        let (mut c, r) = (clients[i % fleet.len()].clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            c.should_rate_limit(r)
                .await
                .unwrap()
                .into_inner()
                .overall_code
                == 1
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    admitted
}

/// How far the real fleet's admitted hits may be from the simulator's prediction for the
/// same scenario and tick phases: 20 hits, 3.3 % of the limit. The prediction's own spread
/// over tick phases and seeds is 605–630 (a replica's share of a burst read binding a few
/// hits below its prior, `core/prior.rs`), and real processes add what the simulator does
/// not model (requests a millisecond late or early, gRPC and Redis latency); the race this
/// test guards against admitted 140–165 more than its prediction.
const EDGE_TOLERANCE: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_at_the_edge_on_two_processes_admits_what_the_simulator_predicts() {
    let _measuring = MEASURING.lock().await;
    // Issue 19, item 11: two replicas, a value nobody has seen on a rule of 600 an hour, ten
    // times that over 6 s: 1,000 requests a second alternating between the replicas, with
    // the production tick (1 s), `strict` by default (`k`) and `strict: false` (`l`). Each
    // replica keeps to its prior, 315, until its first reply is a tick old. The race: the
    // replica whose tick comes first in the surge settled on a read that missed the other's
    // hits since the other's last sync, and took its share of room already spent — the
    // fleet admitted 774 and 776 (1.29×) with `strict: false` when the other ticked 20 ms
    // after it. So the surge starts 20 ms before one replica's tick, the other's following
    // within half a tick, where the race was widest; the simulator runs with the same phases.
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), EDGE_RULES).unwrap();
    let env = [("SYNC_TICK", "1s"), ("SYNC_INTERVAL", "2s")];
    let fleet = tokio::task::block_in_place(|| fleet_of(2, dir.path(), &redis, &env));
    let mut failures = Vec::new();
    for (key, name) in [
        ("k", "edge surge, 2 nodes, strict"),
        ("l", "edge surge, 2 nodes"),
    ] {
        let phases = tokio::task::block_in_place(|| tick_phases(&fleet, &redis));
        let follows = (phases[1] + 1_000 - phases[0]) % 1_000;
        let (leader, lag) = if follows <= 500 {
            (0, follows)
        } else {
            (1, 1_000 - follows)
        };
        let mut sim_phases = vec![20 + lag; 2];
        sim_phases[leader] = 20;
        let scenario = Scenario {
            phases: Some(sim_phases),
            ..sim::scenarios()
                .into_iter()
                .find(|s| s.name == name)
                .unwrap()
        };
        // On a thread of its own: the simulator runs its own runtime.
        let predicted = std::thread::spawn(move || sim::run(&scenario).sluice[0].admitted);
        let predicted = predicted.join().unwrap() as usize;
        // The surge's start, in Redis time (which the replicas' clocks follow): 20 ms before a
        // tick of the leader's, at least 300 ms from now.
        let now = tokio::task::block_in_place(|| redis_now_ms(&redis));
        let read_at = Instant::now();
        let mut start = now - now % 1_000 + phases[leader] + 1_000 - 20;
        while start < now + 300 {
            start += 1_000;
        }
        let begin = read_at + Duration::from_millis(start - now);
        let admitted = surge_at_the_edge(&fleet, begin, (key, "surge"), 6_000).await;
        if admitted > 660 || admitted.abs_diff(predicted) > EDGE_TOLERANCE {
            failures.push(format!(
                "{name}: admitted {admitted} of 600 (phases {phases:?}, lag {lag} ms), the \
                 simulator predicts {predicted}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
