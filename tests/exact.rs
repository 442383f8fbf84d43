//! Exact rules (`exact: true`) against real Redis servers started by the tests (redis-server
//! must be installed; scripts/test.sh installs it): no over-admission by a fleet of in-process
//! replicas under concurrent clients, the sliding window's formula in the script, all or
//! nothing across a Redis Cluster's slots, and the prior when Redis is killed.

mod common;

use common::redis::{global_mode, RedisCluster, RedisServer};
use common::{desc, http_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::global::exact_redis::exact_key;

/// 100 a minute, sliding window (the default), exact.
const RULES: &str = "domain: x\ndescriptors:\n  - key: login\n    rate_limit: {unit: minute, requests_per_unit: 100, exact: true}\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1, exact: true}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, exact: true}\n";

fn req(entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "x".into(),
        descriptors: entries.iter().map(|e| desc(&[*e])).collect(),
        hits_addend: 0,
    }
}

/// The entity of `key`=`value` under RULES.
fn entity(key: &str, value: &str) -> u128 {
    let rules = sluice::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
    rules.find("x", &[(key, value)]).unwrap().entity
}

/// The epoch of a one-minute window at the servers' clock.
fn minute_epoch() -> u64 {
    common::T0.0 / 60_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_replicas_and_sixty_four_clients_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    // The previous minute had 40: at mid-minute the sliding window weighs them as 20, so the
    // fleet may admit 80 more.
    let prev = exact_key("", entity("login", "alice"), 0, minute_epoch() - 1);
    redis.cli(&["SET", &prev, "40"]);
    let mut servers = Vec::new();
    for _ in 0..4 {
        let s = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
        s.clock.set(common::T0.plus_millis(30_000));
        servers.push(s);
    }
    let r = req(&[("login", "alice")]);
    let runs = servers
        .iter()
        .map(|s| s.admitted_by_concurrent_clients(r.clone(), 16, 5));
    let admitted: usize = futures_util::future::join_all(runs).await.into_iter().sum();
    assert_eq!(
        admitted, 80,
        "320 requests, 80 room: exactly the room admitted"
    );
    let curr = exact_key("", entity("login", "alice"), 0, minute_epoch());
    assert_eq!(redis.get(&curr).as_deref(), Some("80"));
    for s in servers {
        s.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_a_refused_request_gives_back_what_other_slots_counted() {
    let cluster = RedisCluster::start(3);
    let s = Server::start(RULES, global_mode(cluster.seed_urls(), true, 4)).await;
    let mut c = s.client().await;
    let both = req(&[("a", "u"), ("b", "u")]);
    let first = c
        .should_rate_limit(both.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, 1, "{first:?}");
    // `a` is full: the call for `b`'s slot counted, then gave its hit back.
    let second = c.should_rate_limit(both).await.unwrap().into_inner();
    assert_eq!(second.overall_code, 2, "{second:?}");
    let key = |k: &str| exact_key("", entity(k, "u"), 0, minute_epoch());
    assert_eq!(cluster.get(&key("a")).as_deref(), Some("1"));
    assert_eq!(cluster.get(&key("b")).as_deref(), Some("1"));
    let (_, _, body) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        body.lines().any(|l| l == "sluice_exact_given_back_total 1"),
        "{body}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_redis_killed_every_request_is_answered_by_the_prior_and_counted() {
    let mut redis = RedisServer::start();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    let r = req(&[("login", "bob")]);
    assert_eq!(s.admitted_by_concurrent_clients(r.clone(), 4, 5).await, 20);
    redis.kill();
    // One replica: its share is the whole limit, on its own count (the 20 went to Redis).
    let admitted = s.admitted_by_concurrent_clients(r, 4, 30).await;
    assert_eq!(
        admitted, 100,
        "every request answered, the prior's limit held"
    );
    let (status, _, body) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert_eq!(status, 200);
    let line = body
        .lines()
        .find(|l| l.starts_with("sluice_exact_fallback_total"))
        .unwrap_or_else(|| panic!("no fallback metric in\n{body}"));
    assert!(line.ends_with(" 120"), "{line}");
    s.stop().await.unwrap();
}
