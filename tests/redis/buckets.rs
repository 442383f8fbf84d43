//! Token buckets end to end, short of Envoy (docs/rules.md, "Buckets"): over gRPC on the in-process
//! server with its manual clock (burst, refill, whole-or-nothing, refunds, a bucket beside a
//! window, strict debt, response headers), and in global mode on a real redis-server (one
//! replica exact, the fleet's bucket shared by three processes, a Redis that restarts empty).

use crate::common;
use crate::common::procs::{query, spawn_sluice, wait_live, Proc, MEASURING};
use crate::common::redis::{global_mode, RedisServer};
use crate::common::{desc, http, wait_until, wait_until_async, Server, T0};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::rls::HeaderNames;

const RULES: &str = r#"
domain: b
descriptors:
  # 10 a second, bursts of 30: docs/rules.md's example.
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10, burst: 30, algorithm: token_bucket}
  # A token every 30 s, two at most: Retry-After in whole seconds worth reading.
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}
  # A bucket that hardly refills, beside a lenient minute window: all or nothing.
  - key: both
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 5, algorithm: token_bucket}
    additional_limits:
      - {unit: minute, requests_per_unit: 3, algorithm: fixed_window, strict: false}
  # The same bucket, lenient (the default) and strict.
  - key: lenient
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 3, algorithm: token_bucket}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 3, algorithm: token_bucket, strict: true}
"#;

/// One descriptor `key=value` with its own `hits_addend` (`None`: the default, 1);
/// `refund` sets `is_negative_hits`.
fn req(key: &str, value: &str, hits: Option<u64>, refund: bool) -> RateLimitRequest {
    let mut d = desc(&[(key, value)]);
    d.hits_addend = hits.map(|value| UInt64Value { value });
    d.is_negative_hits = refund;
    RateLimitRequest {
        domain: "b".into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

async fn send(s: &Server, r: RateLimitRequest) -> RateLimitResponse {
    s.client()
        .await
        .should_rate_limit(r)
        .await
        .unwrap()
        .into_inner()
}

/// The status of a request of `hits` on `key=value`.
async fn hit(s: &Server, key: &str, value: &str, hits: u64) -> DescriptorStatus {
    send(s, req(key, value, Some(hits), false)).await.statuses[0].clone()
}

fn over(st: &DescriptorStatus) -> bool {
    st.code == Code::OverLimit as i32
}

/// `duration_until_reset` in seconds.
fn reset(st: &DescriptorStatus) -> i64 {
    st.duration_until_reset.as_ref().unwrap().seconds
}

/// How many of `n` one-hit requests on `key=value` are admitted, and the last status.
async fn admitted_of(s: &Server, key: &str, value: &str, n: usize) -> (usize, DescriptorStatus) {
    let mut ok = 0;
    let mut last = None;
    for _ in 0..n {
        let st = hit(s, key, value, 1).await;
        ok += usize::from(!over(&st));
        last = Some(st);
    }
    (ok, last.unwrap())
}

#[tokio::test]
async fn a_full_bucket_admits_its_burst_then_refills_at_its_rate() {
    let s = Server::start(RULES, |_| {}).await;
    // A new bucket is full: a look (0 hits) says 30 left, nothing to refill.
    let st = hit(&s, "client", "a", 0).await;
    assert_eq!((over(&st), st.limit_remaining, reset(&st)), (false, 30, 0));
    for n in 1..=30 {
        let st = hit(&s, "client", "a", 1).await;
        assert!(!over(&st), "request {n} of the burst");
        assert_eq!(st.limit_remaining, 30 - n, "request {n}");
    }
    let st = hit(&s, "client", "a", 1).await;
    assert!(over(&st), "the 31st is over the burst");
    assert_eq!(st.limit_remaining, 0);
    // current_limit is the refill rate, not the burst.
    let limit = st.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, Unit::Second as i32)
    );
    // Empty: 30 tokens at 10 a second take 3 s to come back.
    assert_eq!(reset(&st), 3);
    // A second later: 10 tokens, and the 11th request is over again.
    s.clock.advance_ms(1_000);
    let (ok, last) = admitted_of(&s, "client", "a", 11).await;
    assert_eq!(ok, 10);
    assert!(over(&last));
    // 100 ms after that: one token, whatever time the client took between requests.
    s.clock.advance_ms(100);
    assert_eq!(admitted_of(&s, "client", "a", 2).await.0, 1);
    // Another client has a bucket of its own.
    assert_eq!(admitted_of(&s, "client", "b", 31).await.0, 30);
    // Three seconds of quiet fill the bucket, no more: 30 again, never 40.
    s.clock.advance_ms(4_000);
    let st = hit(&s, "client", "a", 0).await;
    assert_eq!((st.limit_remaining, reset(&st)), (30, 0));
    assert_eq!(admitted_of(&s, "client", "a", 31).await.0, 30);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn hits_are_taken_whole_or_not_at_all_and_refunds_stop_at_full() {
    let s = Server::start(RULES, |_| {}).await;
    let st = hit(&s, "client", "w", 25).await;
    assert_eq!((over(&st), st.limit_remaining), (false, 5));
    // 6 do not fit in 5: denied, and none of the 5 is taken.
    let st = hit(&s, "client", "w", 6).await;
    assert_eq!((over(&st), st.limit_remaining), (true, 0));
    let st = hit(&s, "client", "w", 5).await;
    assert_eq!((over(&st), st.limit_remaining), (false, 0));
    // More than the bucket ever holds: denied even when full.
    s.clock.advance_ms(3_000);
    assert!(over(&hit(&s, "client", "w", 31).await));
    assert_eq!(hit(&s, "client", "w", 0).await.limit_remaining, 30);

    // A refund gives tokens back...
    hit(&s, "client", "r", 30).await;
    let refund = |n| send(&s, req("client", "r", Some(n), true));
    let r = refund(4).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "a refund is never denied");
    assert_eq!(hit(&s, "client", "r", 0).await.limit_remaining, 4);
    assert_eq!(admitted_of(&s, "client", "r", 5).await.0, 4);
    // ...never past full: 100 back into an empty bucket of 30 leave it at 30.
    refund(100).await;
    assert_eq!(hit(&s, "client", "r", 0).await.limit_remaining, 30);
    assert_eq!(admitted_of(&s, "client", "r", 31).await.0, 30);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_bucket_beside_a_window_admits_all_or_nothing() {
    let s = Server::start(RULES, |_| {}).await;
    // T0 starts a minute: the window holds 3, the bucket 5.
    let st = hit(&s, "both", "x", 3).await;
    assert!(!over(&st));
    // The next minute: the window holds 3 again, the bucket 2. 3 hits: the bucket says no,
    // and the window (lenient) is not charged for them...
    s.clock.set(T0.plus_millis(60_000));
    let st = hit(&s, "both", "x", 3).await;
    assert!(over(&st));
    let limit = st.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32),
        "the bucket is the limit reported"
    );
    // ...so 2 fit both: the window would refuse them had it counted the 3.
    let st = hit(&s, "both", "x", 2).await;
    assert!(
        !over(&st),
        "the window took nothing from the denied request"
    );
    assert_eq!(st.limit_remaining, 0, "the bucket is empty");

    // The other way round: 5 hours later the bucket is full (5) and the window fresh (3).
    // 4 hits: the window says no, and the bucket (lenient, the default) is not charged...
    s.clock.set(T0.plus_millis(5 * 3_600_000 + 60_000));
    let st = hit(&s, "both", "x", 4).await;
    assert!(over(&st));
    let limit = st.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Minute as i32)
    );
    // ...so 3 then, the next minute, 2 more fit: 5 tokens, all still there.
    assert!(!over(&hit(&s, "both", "x", 3).await));
    s.clock.advance_ms(60_000);
    let st = hit(&s, "both", "x", 2).await;
    assert!(!over(&st), "the bucket lost nothing to the denied request");
    assert!(over(&hit(&s, "both", "x", 1).await), "and now it is empty");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn strict_buckets_charge_denied_hits_down_to_one_capacity_below_empty() {
    let s = Server::start(RULES, |_| {}).await;
    // Both: 3 admitted, then 10 denied at T0.
    for key in ["lenient", "strict"] {
        let (ok, _) = admitted_of(&s, key, "s", 13).await;
        assert_eq!(ok, 3, "{key}");
    }
    // Three hours later (a token an hour): the lenient bucket is full again...
    s.clock.set(T0.plus_millis(3 * 3_600_000));
    let st = hit(&s, "lenient", "s", 0).await;
    assert_eq!((over(&st), st.limit_remaining), (false, 3));
    // ...the strict one owes the denied tokens, its debt bounded at one capacity below
    // empty (6 hours ahead, not the 13 hours all of them would be): empty, and refilled by
    // one token each hour from here.
    let st = hit(&s, "strict", "s", 0).await;
    assert_eq!(
        (over(&st), st.limit_remaining, reset(&st)),
        (false, 0, 3 * 3_600)
    );
    s.clock.set(T0.plus_millis(4 * 3_600_000));
    assert_eq!(hit(&s, "strict", "s", 0).await.limit_remaining, 1);
    // A denied request is charged there too: 2 of 1 is denied and costs the 1 left and more.
    assert!(over(&hit(&s, "strict", "s", 2).await));
    assert!(over(&hit(&s, "strict", "s", 1).await));
    // The lenient bucket charged nothing for its denials: still 3.
    assert_eq!(admitted_of(&s, "lenient", "s", 4).await.0, 3);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn response_headers_report_the_bucket_and_retry_after_when_it_fits() {
    let s = Server::start(RULES, |st| {
        st.options.response_headers = Some(HeaderNames::default())
    })
    .await;
    let h = |r: &RateLimitResponse, name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    // `slow`: 2 a minute, bursts of 2 (a token every 30 s).
    let r = send(&s, req("slow", "h", None, false)).await;
    assert_eq!(h(&r, "RateLimit-Limit").as_deref(), Some("2"));
    assert_eq!(h(&r, "RateLimit-Remaining").as_deref(), Some("1"));
    assert_eq!(
        h(&r, "RateLimit-Reset").as_deref(),
        Some("30"),
        "full again in 30 s"
    );
    assert_eq!(h(&r, "Retry-After"), None);
    send(&s, req("slow", "h", None, false)).await;
    let r = send(&s, req("slow", "h", None, false)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(h(&r, "RateLimit-Remaining").as_deref(), Some("0"));
    assert_eq!(h(&r, "RateLimit-Reset").as_deref(), Some("60"));
    // Retry-After: when the denied request would fit (one token: 30 s), not the reset.
    assert_eq!(h(&r, "Retry-After").as_deref(), Some("30"));
    // 10.5 s later: 19.5 s to wait, rounded up.
    s.clock.advance_ms(10_500);
    let r = send(&s, req("slow", "h", None, false)).await;
    assert_eq!(h(&r, "Retry-After").as_deref(), Some("20"));
    assert_eq!(h(&r, "RateLimit-Reset").as_deref(), Some("50"));
    // Two tokens take the whole refill: 49.5 s, rounded up.
    let r = send(&s, req("slow", "h", Some(2), false)).await;
    assert_eq!(h(&r, "Retry-After").as_deref(), Some("50"));
    // And once waited, it fits.
    s.clock.advance_ms(19_500);
    let r = send(&s, req("slow", "h", None, false)).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(h(&r, "Retry-After"), None);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn the_example_rules_do_what_their_comments_say() {
    let rules = std::fs::read_to_string(common::repo().join("config/rules/buckets.yaml")).unwrap();
    let s = Server::start(&rules, |_| {}).await;
    let admitted = |key: &'static str, n: usize| {
        let s = &s;
        async move {
            let mut ok = 0;
            for _ in 0..n {
                let mut r = req(key, "e", None, false);
                r.domain = "buckets".into();
                ok += usize::from(send(s, r).await.overall_code == Code::Ok as i32);
            }
            ok
        }
    };
    // A leaky bucket of 20 dripping 1 every 250 ms.
    assert_eq!(admitted("queue", 21).await, 20);
    s.clock.advance_ms(250);
    assert_eq!(admitted("queue", 2).await, 1);
    // One of 10 dripping 3 every 2 s.
    assert_eq!(admitted("batch", 11).await, 10);
    // (A millisecond more than 2 s: a token takes 2/3 s rounded to the nanosecond, up here, so
    // the third is 1 ns late at exactly 2 s.)
    s.clock.advance_ms(2_001);
    assert_eq!(admitted("batch", 4).await, 3);
    // Smyte's 100, 10 every 60 s: a token every 6 s, 10 a minute.
    assert_eq!(admitted("api_key", 101).await, 100);
    s.clock.advance_ms(6_000);
    assert_eq!(admitted("api_key", 2).await, 1);
    s.clock.advance_ms(60_000);
    assert_eq!(admitted("api_key", 11).await, 10);
    // Strict: a client that keeps trying at 2 a second (faster than the refill of 1) stays
    // denied; a lenient bucket would admit one a second.
    assert_eq!(admitted("login", 5).await, 5);
    let mut late = 0;
    for _ in 0..20 {
        s.clock.advance_ms(500);
        late += admitted("login", 1).await;
    }
    assert_eq!(late, 0, "the retries keep the debt up");
    s.stop().await.unwrap();
}

// --- Global mode on a real redis-server ---

/// A bucket that refills a token an hour, so a test's count cannot drift with its duration.
const SLOW: &str = "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, burst: 100, algorithm: token_bucket}\n";

/// The Redis key of `k=value`'s bucket in SLOW (`{prefix}sluice:b1:{<entity>}:<limit>`).
fn bucket_key(value: &str) -> String {
    let set = sluice::rules::compile_sources(&[("r.yaml".into(), SLOW.into())], false).unwrap();
    let entity = set.find("g", &[("k", value)]).unwrap().entity;
    format!("sluice:b1:{{{entity:032x}}}:0")
}

/// The bucket hash's `t` (the fleet's TAT, Unix µs) and `n` (tokens spent); None while absent.
fn bucket(redis: &RedisServer, key: &str) -> Option<(u64, u64)> {
    let out = redis.cli(&["HMGET", key, "t", "n"]);
    let mut vals = out.lines().map(|l| l.trim().parse::<f64>().ok());
    match (vals.next().flatten(), vals.next().flatten()) {
        (Some(t), Some(n)) => Some((t as u64, n as u64)),
        _ => None,
    }
}

/// Redis's clock, in Unix µs.
fn redis_now_us(redis: &RedisServer) -> u64 {
    let out = redis.cli(&["TIME"]);
    let mut parts = out.lines().map(|l| l.trim().parse::<u64>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

fn g(value: &str, hits: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "g".into(),
        descriptors: vec![desc(&[("k", value)])],
        hits_addend: hits as u32,
    }
}

const HOUR_US: u64 = 3_600_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replica_is_exact_and_redis_holds_the_fleets_bucket() {
    let redis = RedisServer::start();
    let s = Server::start(SLOW, global_mode(vec![redis.url()], false, 2)).await;
    let admitted = s.admitted_by_concurrent_clients(g("one", 1), 8, 40).await;
    assert_eq!(
        admitted, 100,
        "alone, a replica is exact: the burst, no more"
    );
    s.stop().await.unwrap(); // final flush
    let key = bucket_key("one");
    let (t, n) = bucket(&redis, &key).unwrap_or_else(|| panic!("no hash at {key}"));
    // Lenient: the 220 denied requests spent nothing.
    assert_eq!(n, 100, "tokens spent");
    // The TAT: 100 tokens of an hour each from when they were spent. The server's manual
    // clock stands at T0 (a clock offset from Redis TIME applies to the system clock only),
    // so the value is exact.
    assert_eq!(t, T0.0 * 1000 + 100 * HOUR_US);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_that_restarts_empty_gets_the_bucket_back_from_the_replica() {
    let mut redis = RedisServer::start();
    let s = Server::start(SLOW, global_mode(vec![redis.url()], false, 2)).await;
    let key = bucket_key("restart");
    let mut c = s.client().await;
    let r = c.should_rate_limit(g("restart", 60)).await.unwrap();
    assert_eq!(r.get_ref().overall_code, Code::Ok as i32);
    let mut before = None;
    wait_until_async(30, "60 tokens spent in Redis", || {
        before = bucket(&redis, &key);
        std::future::ready(before.is_some_and(|(_, n)| n == 60))
    })
    .await;
    let (t1, _) = before.unwrap();
    redis.restart(); // no persistence: back empty, on the same port
    assert_eq!(bucket(&redis, &key), None);
    // One more token: the replica's sync states the TAT it last read (`floor_us`), and the
    // store starts the lost bucket from there, so the 60 are not forgotten. The manual clock
    // stands still, so the new TAT is exactly one interval later; the running count of spent
    // tokens (only for measuring rates) starts afresh.
    let r = c.should_rate_limit(g("restart", 1)).await.unwrap();
    assert_eq!(r.get_ref().overall_code, Code::Ok as i32);
    let mut after = None;
    wait_until_async(30, "the bucket back in Redis", || {
        after = bucket(&redis, &key);
        std::future::ready(after.is_some())
    })
    .await;
    assert_eq!(after, Some((t1 + HOUR_US, 1)));
    // And the replica still admits exactly what is left: 39 of 50.
    let admitted = s
        .admitted_by_concurrent_clients(g("restart", 1), 5, 10)
        .await;
    assert_eq!(admitted, 39);
    s.stop().await.unwrap();
}

/// Starts `n` processes on `redis` serving `rules`; waits until each counts all of them.
fn fleet_of(n: u32, rules: &std::path::Path, redis: &RedisServer) -> Vec<Proc> {
    let fleet: Vec<Proc> = (0..n)
        .map(|_| spawn_sluice(rules, &redis.url(), &[]))
        .collect();
    fleet.iter().for_each(|p| wait_live(p, n));
    fleet
}

/// `p`'s `sluice_sync_items_total`: entity limits it has sent in syncs.
fn items_synced(p: &Proc) -> u64 {
    let (_, _, m) = http(p.http, "GET", "/metrics", "", &[]).unwrap();
    m.lines()
        .find_map(|l| l.strip_prefix("sluice_sync_items_total "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// `p`'s tokens left in `k=value`'s bucket, as it sees them: a look that spends nothing.
fn tokens_left(p: &Proc, value: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"g","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}],"hitsAddend":0}}]}}"#
    );
    let (_, _, text) = http(p.http, "POST", "/json", &body, &[]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"));
    v["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

/// Hammers `value` from two client threads per process, `each` requests a thread, all at
/// once; returns how many the fleet admitted.
fn hammer(fleet: &[Proc], value: &str, each: usize) -> usize {
    std::thread::scope(|sc| {
        let clients: Vec<_> = fleet
            .iter()
            .flat_map(|p| [p, p])
            .map(|p| {
                sc.spawn(move || {
                    (0..each)
                        .filter(|_| query(p, value)["overallCode"] == "OK")
                        .count()
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    })
}

/// Waits until Redis holds `admitted` tokens spent in `value`'s bucket (lenient: denied
/// requests spend nothing), then checks its TAT: `admitted` hours ahead of Redis's clock
/// (the processes' system clocks, offset to Redis TIME), within the test's duration.
fn redis_holds(redis: &RedisServer, value: &str, admitted: usize) {
    let key = bucket_key(value);
    wait_until(30, "Redis to hold every admitted token", || {
        bucket(redis, &key).is_some_and(|(_, n)| n == admitted as u64)
    });
    let (t, _) = bucket(redis, &key).unwrap();
    let ahead = t as i64 - redis_now_us(redis) as i64;
    let want = admitted as i64 * HOUR_US as i64;
    assert!(
        (want - 60_000_000..=want).contains(&ahead),
        "t is {ahead} µs ahead of Redis's clock, {want} expected"
    );
}

/// The bound the fleet tests assert: the fleet admitted at least 0.9× the bucket of 100 and
/// at most `max`. Without sync, each of the 3 processes would admit its own 100: 300. The
/// target is 1.10× the exact bucket (ARCHITECTURE.md, "Targets"), which the simulator's
/// bucket scenarios meet; three real processes flooded at the same moment over HTTP take
/// several hits each per burst read's round trip and measure above it (docs/accuracy.md,
/// "Token buckets", known limits), so each test holds what it measured with a margin.
fn assert_fleet_bound(admitted: usize, what: &str, max: usize) {
    assert!(
        (90..=max).contains(&admitted),
        "{what}: the fleet admitted {admitted} of a bucket of 100 (at most {max} expected)"
    );
}

#[test]
fn three_processes_share_a_cold_bucket_within_the_tolerance() {
    let _measuring = MEASURING.blocking_lock();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), SLOW).unwrap();
    // A 100 ms tick, 200 ms sync interval (`spawn_sluice`); system clocks, real HTTP.
    let fleet = fleet_of(3, dir.path(), &redis);
    // 480 requests (4.8× the burst) at once on a bucket no process has seen: each keeps to
    // its prior (1.05 × 100 / 3 = 35) until its first reply is a tick old.
    let admitted = hammer(&fleet, "cold", 80);
    // Measured 107–116 over sixteen runs (104–142 before settled burst reads).
    assert_fleet_bound(admitted, "cold", 120);
    redis_holds(&redis, "cold", admitted);
}

// A warm fleet flooded everywhere at once: over HTTP each process takes several hits per
// burst read's round trip, spent before the next read shows the others'. Measured 105–123
// over thirty-two runs (111–128 before others spending far above the refill shrank the
// spread, `FLOOD_PACE`, and the spend rates' averaging was capped at 10 s,
// `RATE_TAU_MAX_MS` in `core/bucket.rs`; 138–166 before the settled burst reads).
#[test]
fn three_processes_share_a_warm_bucket_within_the_tolerance() {
    let _measuring = MEASURING.blocking_lock();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), SLOW).unwrap();
    let fleet = fleet_of(3, dir.path(), &redis);
    // 60 tokens spent, through each process in turn over about 0.6 s (a spread load, so
    // each measures its share of the fleet's spending as a third), all admitted.
    for i in 0..60 {
        assert_eq!(query(&fleet[i % 3], "warm")["overallCode"], "OK");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    redis_holds(&redis, "warm", 60);
    // Every process reads the fleet's bucket (40 left) and gets a few more replies, so its
    // first is over a tick old: settled, it spends only its share of the room left. (The
    // looks keep the entity queued for the next tick; they spend nothing.)
    for p in &fleet {
        // At most 40: a settled process also deducts the others' spends it expects since
        // its last reply, at the rate it last measured.
        wait_until(
            30,
            "the process to read the fleet's 60 spent tokens",
            || tokens_left(p, "warm") <= 40,
        );
        let seen = items_synced(p);
        wait_until(30, "three more syncs of the bucket", || {
            tokens_left(p, "warm");
            items_synced(p) >= seen + 3
        });
    }
    // Then 480 requests at once, on a bucket of 40 left.
    let admitted = 60 + hammer(&fleet, "warm", 80);
    assert_fleet_bound(admitted, "warm", 130);
    redis_holds(&redis, "warm", admitted);
}
