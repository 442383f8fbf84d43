//! Global mode on the reference's other Redis deployments, against real processes started by
//! the tests (redis-server must be installed; scripts/test.sh installs it): Redis Sentinel
//! (`REDIS_TYPE=SENTINEL`), through a failover of the master, with the sentinels'
//! password; and a separate Redis for per-second limits (`REDIS_PERSECOND`).

use crate::common;
use crate::common::redis::{global_mode, RedisServer};
use crate::common::{desc, wait_until_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::settings::{ServeArgs, Settings};

/// `k`: synced through Redis in the background; `x`: exact, a Redis call per request.
const RULES: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: fixed_window}\n  - key: x\n    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: fixed_window, exact: true}\n";

fn req(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![desc(&[(key, value)])],
        hits_addend: 0,
    }
}

/// Sends `n` requests of `key`=`value`; each must be answered OK.
async fn hit(s: &Server, key: &str, value: &str, n: usize) {
    let mut client = s.client().await;
    for _ in 0..n {
        let r = client
            .should_rate_limit(req(key, value))
            .await
            .expect("sluice answers")
            .into_inner();
        assert_eq!(r.overall_code, 1, "{key}={value}: {r:?}");
    }
}

/// The keys matching `pattern` on `r`.
fn keys(r: &RedisServer, pattern: &str) -> Vec<String> {
    r.cli(&["--scan", "--pattern", pattern])
        .lines()
        .map(str::to_string)
        .collect()
}

/// The hits the background sync wrote to `r`: the sum of every counter's parts.
fn synced(r: &RedisServer) -> u64 {
    keys(r, "*sluice:v2:{*")
        .iter()
        .flat_map(|k| {
            r.cli(&["HVALS", k])
                .lines()
                .map(|v| v.trim().parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The hits exact calls counted in `r`.
fn exact(r: &RedisServer) -> u64 {
    keys(r, "*sluice:x:{*")
        .iter()
        .map(|k| r.get(k).map_or(0, |v| v.parse::<u64>().unwrap()))
        .sum()
}

/// Settings resolved from the reference's variables, as `sluice serve` would.
fn from_env(env: &[(&str, &str)]) -> Settings {
    let env: std::collections::HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::resolve(&ServeArgs::default(), &env).expect("valid settings")
}

/// `SENTINEL get-master-addr-by-name`'s port.
fn master_port(sentinel: &RedisServer, name: &str) -> Option<u16> {
    sentinel
        .try_cli(&["SENTINEL", "get-master-addr-by-name", name])
        .ok()?
        .lines()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_follows_the_master_through_a_failover() {
    // A master and its replica, both behind a password; one sentinel behind another.
    let mut master = RedisServer::start_with(&["--requirepass", "mpw", "--masterauth", "mpw"]);
    let replica = RedisServer::start_with(&[
        "--requirepass",
        "mpw",
        "--masterauth",
        "mpw",
        "--replicaof",
        "127.0.0.1",
        &master.port().to_string(),
    ]);
    let sentinel = RedisServer::start_sentinel("mymaster", &master, &["--requirepass", "spw"]);
    // A sentinel that is down comes first: the others are asked when one does not answer.
    let gone = common::free_port();
    let url = format!("mymaster,127.0.0.1:{gone},127.0.0.1:{}", sentinel.port());
    let resolved = from_env(&[
        ("REDIS_TYPE", "SENTINEL"),
        ("REDIS_URL", &url),
        ("REDIS_AUTH", "mpw"),
        ("REDIS_SENTINEL_AUTH", "spw"),
    ]);
    assert!(resolved.warnings.is_empty(), "{:?}", resolved.warnings);
    let redis = resolved.redis.expect("global mode");
    let s = Server::start(RULES, |s| {
        global_mode(Vec::new(), false, 2)(s);
        s.redis = Some(redis);
    })
    .await;

    // Through the master: synced hits and exact ones, which replication copies.
    hit(&s, "k", "before", 5).await;
    hit(&s, "x", "before", 3).await;
    wait_until_async(
        20,
        "the master and its replica to hold the first hits",
        || async {
            synced(&master) == 5
                && exact(&master) == 3
                && synced(&replica) == 5
                && exact(&replica) == 3
        },
    )
    .await;

    // The master dies; the sentinel promotes the replica (forced, rather than waiting for
    // its quorum's judgement).
    master.kill();
    wait_until_async(30, "the sentinel to promote the replica", || async {
        if master_port(&sentinel, "mymaster") == Some(replica.port()) {
            return replica.cli(&["ROLE"]).starts_with("master");
        }
        // Refused until the sentinel has noticed the replica (NOGOODSLAVE) or while a
        // failover is under way (INPROG): asked again at the next poll.
        let _ = sentinel.try_cli(&["SENTINEL", "FAILOVER", "mymaster"]);
        false
    })
    .await;

    // The same sluice goes on syncing and counting exactly, through the new master.
    hit(&s, "k", "after", 7).await;
    wait_until_async(30, "the synced hits to reach the new master", || async {
        synced(&replica) == 12
    })
    .await;
    // An exact call that meets the dead master fails (the prior decides it) and drops its
    // connection; the next one asks the sentinels again.
    wait_until_async(30, "an exact hit counted by the new master", || async {
        hit(&s, "x", "after", 1).await;
        exact(&replica) > 3
    })
    .await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_refuses_a_wrong_sentinel_password() {
    let master = RedisServer::start();
    let sentinel = RedisServer::start_sentinel("m", &master, &["--requirepass", "spw"]);
    let url = format!("m,127.0.0.1:{}", sentinel.port());
    let redis = from_env(&[
        ("REDIS_TYPE", "SENTINEL"),
        ("REDIS_URL", &url),
        ("REDIS_SENTINEL_AUTH", "wrong"),
    ])
    .redis
    .expect("global mode");
    let s = Server::start(RULES, |s| {
        global_mode(Vec::new(), false, 1)(s);
        s.redis = Some(redis);
    })
    .await;
    // Decisions go on from memory, but nothing reaches the master: the sentinel, asked with
    // the wrong password, names none, and readiness says why.
    hit(&s, "k", "v", 3).await;
    common::wait_for_body(
        s.http,
        "/readyz",
        "redis shard sentinel(m@redis://127.0.0.1",
    )
    .await;
    common::wait_for_body(s.http, "/readyz", "degraded, not answered yet").await;
    let body = common::http_async(s.http, "GET", "/readyz", "")
        .await
        .unwrap()
        .2;
    assert!(!body.contains("spw") && !body.contains("wrong"), "{body}");
    s.stop().await.unwrap();
    assert_eq!(synced(&master), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_second_limits_keep_their_counters_in_their_own_redis() {
    let main = RedisServer::start();
    let per_second = RedisServer::start_with(&["--requirepass", "ppw"]);
    // `sec` and `xsec` count in the per-second Redis (unit second, whatever the multiplier:
    // an hour here, so that no key expires during the test); `mixed` stays in the main one.
    const RULES: &str = "domain: d\ndescriptors:\n  - key: sec\n    rate_limit: {unit: second, unit_multiplier: 3600, requests_per_unit: 1000, algorithm: fixed_window}\n  - key: min\n    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: fixed_window}\n  - key: xsec\n    rate_limit: {unit: second, unit_multiplier: 3600, requests_per_unit: 1000, algorithm: fixed_window, exact: true}\n  - key: xmin\n    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: fixed_window, exact: true}\n  - key: mixed\n    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: fixed_window}\n    additional_limits:\n      - {unit: hour, requests_per_unit: 100000, algorithm: fixed_window}\n";
    let resolved = from_env(&[
        ("REDIS_URL", &main.url()),
        ("REDIS_PERSECOND", "true"),
        (
            "REDIS_PERSECOND_URL",
            &format!("127.0.0.1:{}", per_second.port()),
        ),
        ("REDIS_PERSECOND_AUTH", "ppw"),
    ]);
    assert!(resolved.warnings.is_empty(), "{:?}", resolved.warnings);
    let (redis, ps) = (resolved.redis, resolved.redis_per_second);
    assert!(ps.is_some());
    let s = Server::start(RULES, |s| {
        global_mode(Vec::new(), false, 1)(s);
        s.redis = redis;
        s.redis_per_second = ps;
    })
    .await;
    hit(&s, "sec", "a", 4).await;
    hit(&s, "min", "a", 6).await;
    hit(&s, "xsec", "a", 2).await;
    hit(&s, "xmin", "a", 5).await;
    hit(&s, "mixed", "a", 3).await;
    wait_until_async(20, "each rule's hits in its Redis", || async {
        synced(&per_second) == 4
            && exact(&per_second) == 2
            // `min`'s 6, and `mixed`'s 3 for each of its two limits.
            && synced(&main) == 12
            && exact(&main) == 5
    })
    .await;
    // Both servers hear the replica's heartbeats: each counts the fleet for its shards.
    for r in [&main, &per_second] {
        assert_eq!(r.cli(&["ZCARD", "sluice:replicas"]), "1");
    }
    s.stop().await.unwrap();
    assert_eq!(synced(&per_second), 4);
    assert_eq!(synced(&main), 12);
}
