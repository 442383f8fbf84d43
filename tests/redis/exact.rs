//! Exact rules (`exact: true`) against real Redis servers started by the tests (redis-server
//! must be installed; scripts/test.sh installs it): no over-admission by a fleet of in-process
//! replicas under concurrent clients, the sliding window's formula in the script, all or
//! nothing across a Redis Cluster's slots, and the prior when Redis is killed; a refund through
//! one replica clearing the others' over answers within a tick; the same for token buckets (a
//! bucket's burst exactly, a bucket beside a window, refunds, a cluster).

use crate::common;
use crate::common::redis::{global_mode, RedisCluster, RedisServer};
use crate::common::{desc, http_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::global::redis::exact::{exact_bucket_key, exact_key};

/// 100 a minute, sliding window (the default), exact; `tb`, a bucket of 100 refilling 1 an
/// hour; `bw`, a bucket of 3 refilling 1 an hour beside a fixed window of 5 a minute; `f3`, a
/// bucket of 4 refilling 3 a second (a token every 333,333,333 ns); `cc`, 2 in flight with a
/// lease of a minute.
const RULES: &str = "domain: x\ndescriptors:\n  - key: login\n    rate_limit: {unit: minute, requests_per_unit: 100, exact: true}\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1, exact: true}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, exact: true}\n  - key: tb\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 100, exact: true}\n  - key: bw\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 3, exact: true}\n    additional_limits:\n      - {unit: minute, requests_per_unit: 5, algorithm: fixed_window, strict: false}\n  - key: f3\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 4, exact: true}\n  - key: cc\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, exact: true}\n";

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

const CAROL: (&str, &str) = ("b", "carol");

/// `n` hits of `key`=`value` through `s`'s gRPC port, given back with `refund`.
async fn ask(s: &Server, (key, value): (&str, &str), n: u64, refund: bool) -> RateLimitResponse {
    let r = hits(key, value, n, refund);
    s.client()
        .await
        .should_rate_limit(r)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_through_one_replica_clears_the_others_over_answer_within_a_tick() {
    // Reserve, then settle: A reserves the whole minute of `b` (5); B is refused and keeps
    // the key as over; A gives 3 back. B asks Redis again once its entry is a sync tick old
    // (50 ms here), and admits what the refund freed (PR #1230 of envoyproxy/ratelimit: there,
    // every replica's over-limit cache kept refusing until the window ended).
    let redis = RedisServer::start();
    let a = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    let b = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    assert_eq!(ask(&a, CAROL, 5, false).await.overall_code, 1);
    assert_eq!(ask(&b, CAROL, 1, false).await.overall_code, 2);
    let settle = ask(&a, CAROL, 3, true).await;
    assert_eq!(
        (settle.overall_code, settle.statuses[0].limit_remaining),
        (1, 3),
        "the refund reports what it leaves"
    );
    let key = exact_key("", entity("b", "carol"), 0, minute_epoch());
    assert_eq!(redis.get(&key).as_deref(), Some("2"));
    // Within the tick B still answers from memory; a second on, Redis decides: 3 fit.
    b.clock.set(common::T0.plus_millis(49));
    assert_eq!(ask(&b, CAROL, 1, false).await.overall_code, 2);
    b.clock.set(common::T0.plus_millis(1_000));
    assert_eq!(ask(&b, CAROL, 3, false).await.overall_code, 1);
    assert_eq!(redis.get(&key).as_deref(), Some("5"));
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_hold_an_exact_concurrency_limit_released_anywhere_and_lapsing() {
    const DAVE: (&str, &str) = ("cc", "dave");
    let redis = RedisServer::start();
    let a = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    let b = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    // A holds both places: B is refused. A request of A's ends and its release lands on B.
    assert_eq!(ask(&a, DAVE, 2, false).await.overall_code, 1);
    assert_eq!(ask(&b, DAVE, 1, false).await.overall_code, 2);
    assert_eq!(ask(&b, DAVE, 1, true).await.overall_code, 1);
    assert_eq!(ask(&b, DAVE, 1, false).await.overall_code, 1);
    assert_eq!(ask(&a, DAVE, 1, false).await.overall_code, 2);
    let key = exact_key("", entity("cc", "dave"), 0, minute_epoch());
    assert_eq!(redis.get(&key).as_deref(), Some("2"));
    // In the next minute the two still hold (their lease); the minute after, they lapsed.
    for (s, at) in [(&a, 119_999), (&b, 119_999)] {
        s.clock.set(common::T0.plus_millis(at));
    }
    assert_eq!(ask(&a, DAVE, 1, false).await.overall_code, 2);
    for s in [&a, &b] {
        s.clock.set(common::T0.plus_millis(120_000));
    }
    assert_eq!(ask(&a, DAVE, 2, false).await.overall_code, 1);
    assert_eq!(ask(&b, DAVE, 1, false).await.overall_code, 2);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

// === token buckets ===

const HOUR_US: u64 = 3_600_000_000;

/// One descriptor `key`=`value` of `n` hits, given back with `refund`.
fn hits(key: &str, value: &str, n: u64, refund: bool) -> RateLimitRequest {
    let mut d = desc(&[(key, value)]);
    d.hits_addend = Some(UInt64Value { value: n });
    d.is_negative_hits = refund;
    RateLimitRequest {
        domain: "x".into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

/// What a bucket key holds when its `tat` is `ahead_us` past `now` (the script writes Unix µs
/// with three decimals: whole nanoseconds).
fn tat_at(now: sluice::core::UnixMillis, ahead_us: u64) -> String {
    format!("{}.000", now.0 * 1000 + ahead_us)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_replicas_and_sixty_four_clients_take_exactly_a_buckets_burst() {
    let redis = RedisServer::start();
    let mut servers = Vec::new();
    for _ in 0..4 {
        servers.push(Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await);
    }
    let r = req(&[("tb", "alice")]);
    let runs = servers
        .iter()
        .map(|s| s.admitted_by_concurrent_clients(r.clone(), 16, 5));
    let admitted: usize = futures_util::future::join_all(runs).await.into_iter().sum();
    assert_eq!(
        admitted, 100,
        "320 requests on a bucket of 100 refilling 1 an hour: exactly the burst admitted"
    );
    // The bucket is empty: full again in 100 hours, and its key lives that long (and 1 s).
    let key = exact_bucket_key("", entity("tb", "alice"), 0);
    assert_eq!(
        redis.get(&key).as_deref(),
        Some(tat_at(common::T0, 100 * HOUR_US).as_str())
    );
    let ttl: u64 = redis.cli(&["PTTL", &key]).trim().parse().unwrap();
    let full_ms = 100 * HOUR_US / 1000;
    assert!(ttl > full_ms - 60_000 && ttl <= full_ms + 1_000, "{ttl}");
    // An hour later, one token for the whole fleet.
    for s in &servers {
        s.clock.set(common::T0.plus_millis(3_600_000));
    }
    let runs = servers
        .iter()
        .map(|s| s.admitted_by_concurrent_clients(r.clone(), 4, 2));
    let admitted: usize = futures_util::future::join_all(runs).await.into_iter().sum();
    assert_eq!(admitted, 1);
    for s in servers {
        s.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_and_a_window_on_one_exact_descriptor_count_all_or_nothing() {
    let redis = RedisServer::start();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    let mut c = s.client().await;
    let r = req(&[("bw", "u")]);
    let bucket = exact_bucket_key("", entity("bw", "u"), 0);
    let window = |epoch: u64| exact_key("", entity("bw", "u"), 1, epoch);
    // The window has room for one: the first request spends a token and counts a hit.
    redis.cli(&["SET", &window(minute_epoch()), "4"]);
    let first = c.should_rate_limit(r.clone()).await.unwrap().into_inner();
    assert_eq!(first.overall_code, 1, "{first:?}");
    assert_eq!(redis.get(&bucket), Some(tat_at(common::T0, HOUR_US)));
    // The window is full, the bucket has two tokens: refused, and no token is spent.
    let second = c.should_rate_limit(r.clone()).await.unwrap().into_inner();
    assert_eq!(second.overall_code, 2, "{second:?}");
    assert_eq!(redis.get(&bucket), Some(tat_at(common::T0, HOUR_US)));
    assert_eq!(redis.get(&window(minute_epoch())).as_deref(), Some("5"));
    // The next minute: two requests empty the bucket; the third is refused by it, and the
    // window, which had room, counts nothing.
    let t1 = common::T0.plus_millis(60_000);
    s.clock.set(t1);
    for want in [1, 1, 2] {
        let resp = c.should_rate_limit(r.clone()).await.unwrap().into_inner();
        assert_eq!(resp.overall_code, want, "{resp:?}");
    }
    assert_eq!(
        redis.get(&bucket),
        Some(tat_at(common::T0, 3 * HOUR_US)),
        "spent from the tat, not from now: the bucket had not refilled"
    );
    assert_eq!(redis.get(&window(minute_epoch() + 1)).as_deref(), Some("2"));
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_gives_tokens_back_to_an_exact_bucket_never_past_full() {
    let redis = RedisServer::start();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    let mut c = s.client().await;
    let key = exact_bucket_key("", entity("tb", "bob"), 0);
    let send = |n: u64, refund: bool| {
        let r = hits("tb", "bob", n, refund);
        let mut c = c.clone();
        async move { c.should_rate_limit(r).await.unwrap().into_inner() }
    };
    assert_eq!(send(100, false).await.overall_code, 1);
    assert_eq!(send(1, false).await.overall_code, 2);
    send(40, true).await;
    assert_eq!(redis.get(&key), Some(tat_at(common::T0, 60 * HOUR_US)));
    let over = send(41, false).await;
    assert_eq!(over.overall_code, 2, "{over:?}");
    assert_eq!(over.statuses[0].limit_remaining, 0);
    let ok = send(40, false).await;
    assert_eq!(ok.overall_code, 1, "{ok:?}");
    // More back than was spent: full, the key gone, and no more than 100 fit.
    send(1000, true).await;
    assert_eq!(redis.get(&key), None);
    assert_eq!(send(101, false).await.overall_code, 2);
    let full = c
        .should_rate_limit(hits("tb", "bob", 100, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(full.overall_code, 1, "{full:?}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_a_refused_request_gives_back_the_tokens_another_slot_spent() {
    let cluster = RedisCluster::start(3);
    let s = Server::start(RULES, global_mode(cluster.seed_urls(), true, 4)).await;
    let mut c = s.client().await;
    let both = req(&[("a", "v"), ("tb", "v")]);
    let first = c
        .should_rate_limit(both.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, 1, "{first:?}");
    // `a` is full: the call for the bucket's entity spent a token, then gave it back.
    let second = c.should_rate_limit(both).await.unwrap().into_inner();
    assert_eq!(second.overall_code, 2, "{second:?}");
    let bucket = exact_bucket_key("", entity("tb", "v"), 0);
    assert_eq!(cluster.get(&bucket), Some(tat_at(common::T0, HOUR_US)));
    assert_eq!(
        cluster
            .get(&exact_key("", entity("a", "v"), 0, minute_epoch()))
            .as_deref(),
        Some("1")
    );
    let (_, _, body) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        body.lines().any(|l| l == "sluice_exact_given_back_total 1"),
        "{body}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exact_bucket_refills_to_the_nanosecond() {
    let redis = RedisServer::start();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 4)).await;
    let mut c = s.client().await;
    let r = req(&[("f3", "u")]);
    let key = exact_bucket_key("", entity("f3", "u"), 0);
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(
            c.should_rate_limit(r.clone())
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    assert_eq!(codes, [1, 1, 1, 1, 2]);
    // Four tokens of 333,333,333 ns: the tat keeps the nanoseconds.
    let t0_us = common::T0.0 * 1000;
    assert_eq!(redis.get(&key), Some(format!("{}.332", t0_us + 1_333_333)));
    // 333 ms is not quite a token (answered from memory: the tat the refusal read says so);
    // 334 ms is, and Redis spends it from the tat it parses.
    s.clock.set(common::T0.plus_millis(333));
    assert_eq!(
        c.should_rate_limit(r.clone())
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        2
    );
    s.clock.set(common::T0.plus_millis(334));
    assert_eq!(
        c.should_rate_limit(r.clone())
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        1
    );
    assert_eq!(redis.get(&key), Some(format!("{}.665", t0_us + 1_666_666)));
    s.stop().await.unwrap();
}
