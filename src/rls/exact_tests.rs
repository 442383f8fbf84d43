//! Tests of the exact path over the in-memory store: all or nothing, keys known over, the prior
//! when the store fails, and token buckets beside windows.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{rate_limit_response::Code, RateLimitRequest};

use super::*;
use crate::core::clock::ManualClock;
use crate::core::table::EntityTable;
use crate::global::memory::MemoryStore;
use crate::global::{ExactClient, Fleet, ShardRouter, SyncQueues};
use crate::rls::{GlobalMode, Options, RateLimiter};

/// The start of a minute.
const T0: UnixMillis = UnixMillis(1_700_006_400_000);

const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window, exact: true}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, exact: true}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 10, exact: true}\n";

struct Fixture {
    limiter: Arc<RateLimiter>,
    store: Arc<MemoryStore>,
    queues: Arc<SyncQueues>,
    fleet: Arc<Fleet>,
    clock: ManualClock,
}

fn fixture() -> Fixture {
    fixture_with(RULES, Options::default())
}

fn fixture_with(yaml: &str, opts: Options) -> Fixture {
    replica_of(yaml, opts, Arc::new(MemoryStore::default()))
}

/// A replica of its own (limiter, queues, clock) on `store`.
fn replica_of(yaml: &str, opts: Options, store: Arc<MemoryStore>) -> Fixture {
    let rules = crate::rules::compile_sources(&[("r.yaml".into(), yaml.into())], false).unwrap();
    let names = vec!["memory".to_string()];
    let queues = Arc::new(SyncQueues::new(ShardRouter::new(&names), 1, 10_000));
    let clock = ManualClock::new(T0);
    let telemetry = Arc::new(crate::telemetry::Telemetry::new().unwrap());
    let client = ExactClient::new(
        vec![store.clone()],
        ShardRouter::new(&names),
        Duration::from_millis(100),
    );
    let fleet = Arc::new(Fleet::new(1));
    let global = GlobalMode {
        queues: queues.clone(),
        fleet: fleet.clone(),
        exact: Some(client),
    };
    let limiter = RateLimiter::new(
        rules,
        vec![],
        Arc::new(clock.clone()),
        opts.clone(),
        telemetry,
        EntityTable::new(opts.cache),
        Some(global),
    );
    Fixture {
        limiter,
        store,
        queues,
        fleet,
        clock,
    }
}

fn req(keys: &[&str]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors: keys
            .iter()
            .map(|k| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: "u1".into(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Each descriptor's code and remaining.
async fn ask(f: &Fixture, keys: &[&str]) -> Vec<(i32, u32)> {
    let r = f.limiter.should_rate_limit_async(&req(keys)).await.unwrap();
    r.statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

/// The store's exact counts, summed per epoch-independent key (one entity per rule here).
fn stored(f: &Fixture) -> Vec<u64> {
    let mut v: Vec<u64> = f.store.exact.lock().values().copied().collect();
    v.sort_unstable();
    v
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn a_request_counts_all_its_exact_descriptors_or_none() {
    let f = fixture();
    assert_eq!(ask(&f, &["a", "b"]).await, vec![(OK, 1), (OK, 4)]);
    assert_eq!(ask(&f, &["a", "b"]).await, vec![(OK, 0), (OK, 3)]);
    // `a` is full: `b` fits but is not counted either, and the request is over.
    assert_eq!(ask(&f, &["a", "b"]).await, vec![(OVER, 0), (OK, 2)]);
    assert_eq!(stored(&f), vec![2, 2]);
    // Alone, `b` is counted.
    assert_eq!(ask(&f, &["b"]).await, vec![(OK, 2)]);
    assert_eq!(stored(&f), vec![2, 3]);
    // Nothing reached the local counters or the background sync.
    assert!(f.queues.is_empty());
}

#[tokio::test]
async fn a_key_known_to_be_over_is_answered_from_memory_for_a_tick_until_its_window_moves() {
    let f = fixture();
    for _ in 0..2 {
        assert_eq!(ask(&f, &["a"]).await[0].0, OK);
    }
    assert_eq!(ask(&f, &["a"]).await[0].0, OVER);
    let calls = f.store.exact_calls.load(Ordering::Relaxed);
    assert_eq!(calls, 3);
    assert_eq!(f.limiter.over.len(), 1);
    // Over again, with no store call, for the rest of the sync tick (1 s); `c` alone still
    // calls.
    f.clock.advance_ms(999);
    for _ in 0..5 {
        assert_eq!(ask(&f, &["a", "c"]).await, vec![(OVER, 0), (OK, 9)]);
    }
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls);
    assert_eq!(stored(&f), vec![2]);
    let stats = f.limiter.exact.as_ref().unwrap().stats.clone();
    assert_eq!(stats.from_memory.load(Ordering::Relaxed), 5);
    // A tick on, Redis is asked again (one call, still over), and remembered for a tick more,
    // up to the window's end.
    f.clock.advance_ms(1);
    assert_eq!(ask(&f, &["a"]).await, vec![(OVER, 0)]);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 1);
    f.clock.advance_ms(58_999);
    assert_eq!(ask(&f, &["a"]).await, vec![(OVER, 0)]);
    assert_eq!(ask(&f, &["a"]).await, vec![(OVER, 0)]);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 2);
    // The next window: asked again, and admitted.
    f.clock.advance_ms(1);
    assert_eq!(ask(&f, &["a"]).await, vec![(OK, 1)]);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 3);
}

#[tokio::test]
async fn a_refund_clears_a_key_known_over_here_at_once_and_on_other_replicas_within_a_tick() {
    // Two replicas on one store. `a` takes 2 a minute: a reservation of 2 through A fills it.
    let a = fixture();
    let b = replica_of(RULES, Options::default(), a.store.clone());
    assert_eq!(status(&a.limiter, &hits("a", 2, false)).await.0, OK);
    for f in [&a, &b] {
        assert_eq!(status(&f.limiter, &hits("a", 1, false)).await.0, OVER);
        assert_eq!(f.limiter.over.len(), 1);
    }
    // A gives one back (the settle): its entry goes, and the refund reports what it leaves.
    assert_eq!(
        status(&a.limiter, &hits("a", 1, true)).await,
        (OK, 1, 60, 0)
    );
    assert_eq!(a.limiter.over.len(), 0);
    assert_eq!(status(&a.limiter, &hits("a", 1, false)).await.0, OK);
    assert_eq!(status(&a.limiter, &hits("a", 1, true)).await.0, OK);
    // B does not see the refund until its entry is a tick old; then Redis admits.
    b.clock.advance_ms(999);
    assert_eq!(status(&b.limiter, &hits("a", 1, false)).await.0, OVER);
    b.clock.advance_ms(1);
    assert_eq!(
        status(&b.limiter, &hits("a", 1, false)).await,
        (OK, 0, 59, 0)
    );
    assert_eq!(stored(&a), vec![2]);
}

#[tokio::test]
async fn with_the_store_down_the_prior_decides_on_this_replicas_share() {
    let f = fixture();
    f.fleet.set_live_replicas(4);
    f.store.down.store(true, Ordering::Relaxed);
    // `c` allows 10 a minute: this replica's share of 4 is 1.05 × 10 / 4, 2 whole hits.
    // The statuses report the rule's own limit, as every decision from memory does.
    assert_eq!(ask(&f, &["c"]).await, vec![(OK, 9)]);
    assert_eq!(ask(&f, &["c"]).await, vec![(OK, 8)]);
    assert_eq!(ask(&f, &["c"]).await, vec![(OVER, 0)]);
    let stats = f.limiter.exact.as_ref().unwrap().stats.clone();
    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 3);
    let metrics = f.limiter.telemetry().render();
    assert!(
        metrics.contains("sluice_exact_fallback_total 3"),
        "{metrics}"
    );
    // Counted like a normal rule's hits: queued for the background sync.
    assert_eq!(f.queues.len(), 1);
    // Redis back: the exact counters decide again (they never saw the prior's hits).
    f.store.down.store(false, Ordering::Relaxed);
    assert_eq!(ask(&f, &["c"]).await, vec![(OK, 9)]);
}

#[tokio::test]
async fn a_shard_failing_gives_back_what_the_other_counted_and_the_prior_decides() {
    let f = fixture();
    let names = vec!["m0".to_string(), "m1".to_string()];
    let router = ShardRouter::new(&names);
    let rules = crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
    let shard = |k: &str| router.shard(rules.find("d", &[(k, "u1")]).unwrap().entity);
    let (up, down) = (shard("b"), 1 - shard("b"));
    let other = ["a", "c"].into_iter().find(|k| shard(k) == down).unwrap();
    let stores = [
        Arc::new(MemoryStore::default()),
        Arc::new(MemoryStore::default()),
    ];
    stores[down].down.store(true, Ordering::Relaxed);
    let client = ExactClient::new(
        stores.iter().map(|s| s.clone() as _).collect(),
        router,
        Duration::from_millis(100),
    );
    let limiter = RateLimiter::new(
        rules,
        vec![],
        Arc::new(f.clock.clone()),
        Options::default(),
        Arc::new(crate::telemetry::Telemetry::new().unwrap()),
        EntityTable::new(Options::default().cache),
        Some(GlobalMode {
            queues: f.queues.clone(),
            fleet: f.fleet.clone(),
            exact: Some(client),
        }),
    );
    let r = limiter
        .should_rate_limit_async(&req(&["b", other]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK, "the prior admits");
    // `b`'s shard counted, then gave it back: the store holds nothing for it.
    let held: u64 = stores[up].exact.lock().values().sum();
    assert_eq!(held, 0);
    let stats = limiter.exact.as_ref().unwrap().stats.clone();
    assert_eq!(stats.given_back.load(Ordering::Relaxed), 1);
    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn without_exact_descriptors_nothing_is_asked() {
    let f = fixture();
    let r = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "unknown".into(),
                value: "x".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    f.limiter.should_rate_limit_async(&r).await.unwrap();
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), 0);
}

// === token buckets ===

/// `t`: a bucket of 3 refilling 1 an hour. `tw`: a bucket of 5 refilling 1 a second beside a
/// fixed window of 10 a minute. `f`: a bucket of 4 refilling 3 a second (a refill interval that
/// is no whole number of microseconds). `p`: a bucket of 8 refilling 1 an hour. Windows say
/// `strict: false` so that local mode counts as exact rules do (admitted hits only).
const BUCKETS: &str = r#"domain: d
descriptors:
  - key: t
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 3, exact: true}
  - key: tw
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 5, exact: true}
    additional_limits:
      - {unit: minute, requests_per_unit: 10, algorithm: fixed_window, strict: false}
  - key: f
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 4, exact: true}
    additional_limits:
      - {unit: second, requests_per_unit: 7, strict: false}
  - key: p
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 8, exact: true}
"#;

const HOUR_MS: u64 = 3_600_000;
const HOUR_NS: u64 = HOUR_MS * 1_000_000;

fn bucket_fixture() -> Fixture {
    let opts = Options {
        response_headers: Some(crate::rls::HeaderNames::default()),
        ..Options::default()
    };
    fixture_with(BUCKETS, opts)
}

/// One descriptor `key`=u1 of `hits`, given back with `refund`.
fn hits(key: &str, hits: u64, refund: bool) -> RateLimitRequest {
    let mut r = req(&[key]);
    r.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    r.descriptors[0].is_negative_hits = refund;
    r
}

/// The code, remaining, seconds to reset and `Retry-After` (0: none) of a one-descriptor
/// request.
async fn status(limiter: &RateLimiter, r: &RateLimitRequest) -> (i32, u32, i64, u64) {
    let resp = limiter.should_rate_limit_async(r).await.unwrap();
    let s = &resp.statuses[0];
    let retry = resp
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "Retry-After")
        .map_or(0, |h| h.value.parse().unwrap());
    let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    (s.code, s.limit_remaining, reset, retry)
}

/// The exact buckets' `tat`s held by the store (Unix ns), by limit index.
fn tats(f: &Fixture) -> Vec<(u8, u64)> {
    let mut v: Vec<(u8, u64)> = f
        .store
        .exact_buckets
        .lock()
        .iter()
        .map(|(k, t)| (k.1, *t))
        .collect();
    v.sort_unstable();
    v
}

fn ns(t: UnixMillis) -> u64 {
    t.0 * 1_000_000
}

#[tokio::test]
async fn an_exact_bucket_takes_its_burst_then_a_token_per_interval() {
    let f = bucket_fixture();
    let h = 3600;
    // Each spend pushes the time until full an hour further.
    assert_eq!(status(&f.limiter, &req(&["t"])).await, (OK, 2, h, 0));
    assert_eq!(status(&f.limiter, &req(&["t"])).await, (OK, 1, 2 * h, 0));
    assert_eq!(status(&f.limiter, &req(&["t"])).await, (OK, 0, 3 * h, 0));
    // Empty: full again in 3 hours; this request fits in one.
    assert_eq!(
        status(&f.limiter, &req(&["t"])).await,
        (OVER, 0, 3 * h, h as u64)
    );
    assert_eq!(tats(&f), vec![(0, ns(T0) + 3 * HOUR_NS)]);
    // Two tokens at once fit in two hours.
    assert_eq!(
        status(&f.limiter, &hits("t", 2, false)).await.3,
        2 * h as u64
    );
    f.clock.advance_ms(HOUR_MS);
    assert_eq!(status(&f.limiter, &req(&["t"])).await, (OK, 0, 3 * h, 0));
    assert_eq!(tats(&f), vec![(0, ns(T0) + 4 * HOUR_NS)]);
    // Nothing reached the local counters or the background sync.
    assert!(f.queues.is_empty());
}

#[tokio::test]
async fn a_denied_bucket_is_answered_from_memory_until_the_request_would_fit() {
    let f = bucket_fixture();
    for _ in 0..3 {
        assert_eq!(status(&f.limiter, &req(&["t"])).await.0, OK);
    }
    assert_eq!(status(&f.limiter, &req(&["t"])).await.0, OVER);
    let calls = f.store.exact_calls.load(Ordering::Relaxed);
    assert_eq!(f.limiter.over.len(), 1);
    // A token comes back an hour after the first spend: until then refused, from memory for
    // a sync tick (1 s) after each read.
    f.clock.advance_ms(999);
    assert_eq!(status(&f.limiter, &req(&["t"])).await.0, OVER);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls);
    f.clock.advance_ms(HOUR_MS - 1000);
    for _ in 0..3 {
        let s = status(&f.limiter, &req(&["t"])).await;
        assert_eq!(
            (s.0, s.3),
            (OVER, 1),
            "retry in 1 ms, rounded up to a second"
        );
    }
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 1);
    // Two tokens would not fit for another hour: still from memory.
    f.clock.advance_ms(1);
    assert_eq!(status(&f.limiter, &hits("t", 2, false)).await.0, OVER);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 1);
    // One does: asked, and admitted.
    assert_eq!(status(&f.limiter, &req(&["t"])).await.0, OK);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 2);
    let stats = f.limiter.exact.as_ref().unwrap().stats.clone();
    assert_eq!(stats.from_memory.load(Ordering::Relaxed), 4);
}

#[tokio::test]
async fn a_bucket_and_a_window_on_one_descriptor_count_all_or_nothing() {
    let f = bucket_fixture();
    for _ in 0..5 {
        assert_eq!(status(&f.limiter, &req(&["tw"])).await.0, OK);
    }
    // The bucket is empty, the window has room: refused, and the window counts nothing.
    assert_eq!(
        status(&f.limiter, &req(&["tw"])).await,
        (OVER, 0, 5, 1),
        "full again in 5 s, a token in 1 s"
    );
    assert_eq!(stored(&f), vec![5]);
    assert_eq!(tats(&f), vec![(0, ns(T0) + 5_000_000_000)]);
    f.clock.advance_ms(5_000);
    for _ in 0..5 {
        assert_eq!(status(&f.limiter, &req(&["tw"])).await.0, OK);
    }
    assert_eq!(stored(&f), vec![10]);
    let spent = tats(&f);
    // The window is full, the bucket full again: refused, and the bucket spends nothing.
    f.clock.advance_ms(5_000);
    let s = status(&f.limiter, &req(&["tw"])).await;
    assert_eq!((s.0, s.1, s.3), (OVER, 0, 50), "the window ends in 50 s");
    assert_eq!(tats(&f), spent);
    assert_eq!(stored(&f), vec![10]);
}

#[tokio::test]
async fn a_refund_gives_tokens_back_never_past_full() {
    let f = bucket_fixture();
    assert_eq!(status(&f.limiter, &hits("t", 3, false)).await.1, 0);
    // Two back: one token owed, an hour until full.
    status(&f.limiter, &hits("t", 2, true)).await;
    assert_eq!(tats(&f), vec![(0, ns(T0) + HOUR_NS)]);
    // Five back: full (the key goes), not two past it.
    status(&f.limiter, &hits("t", 5, true)).await;
    assert_eq!(tats(&f), vec![]);
    assert_eq!(status(&f.limiter, &hits("t", 3, false)).await.0, OK);
    assert_eq!(status(&f.limiter, &hits("t", 1, false)).await.0, OVER);
    // A refund is never answered from memory: it reaches the store and clears the entry.
    status(&f.limiter, &hits("t", 1, true)).await;
    assert_eq!(f.limiter.over.len(), 0);
    assert_eq!(status(&f.limiter, &req(&["t"])).await, (OK, 0, 3 * 3600, 0));
}

#[tokio::test]
async fn with_the_store_down_a_bucket_is_decided_by_the_prior() {
    let f = bucket_fixture();
    f.fleet.set_live_replicas(4);
    f.store.down.store(true, Ordering::Relaxed);
    // `p` holds 8: this replica's share of 4 is 1.05 × 8 / 4, 2 whole tokens, as for any
    // cold bucket in global mode. The statuses report the rule's own bucket.
    assert_eq!(ask(&f, &["p"]).await, vec![(OK, 7)]);
    assert_eq!(ask(&f, &["p"]).await, vec![(OK, 6)]);
    assert_eq!(ask(&f, &["p"]).await, vec![(OVER, 0)]);
    let stats = f.limiter.exact.as_ref().unwrap().stats.clone();
    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 3);
    // Spent like a normal rule's tokens: queued for the background sync.
    assert_eq!(f.queues.len(), 1);
    assert_eq!(tats(&f), vec![]);
    // Redis back: the exact bucket decides again (it never saw the prior's spends).
    f.store.down.store(false, Ordering::Relaxed);
    assert_eq!(ask(&f, &["p"]).await, vec![(OK, 7)]);
}

#[tokio::test]
async fn exact_buckets_report_what_local_mode_reports() {
    let exact = bucket_fixture();
    let rules = crate::rules::compile_sources(&[("r.yaml".into(), BUCKETS.into())], false).unwrap();
    let local = RateLimiter::new(
        rules,
        vec![],
        Arc::new(exact.clock.clone()),
        exact.limiter.options().clone(),
        Arc::new(crate::telemetry::Telemetry::new().unwrap()),
        EntityTable::new(exact.limiter.options().cache),
        None,
    );
    // A fixed pseudo-random walk: keys, hits 0..=3, a refund one time in eight, steps of
    // up to 0.7 s (past an hour now and then, for `t`).
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut over = 0;
    for step in 0..3000 {
        let key = ["t", "tw", "f"][next(3) as usize];
        let r = hits(key, next(4), next(8) == 0);
        let want = status(&local, &r).await;
        let got = status(&exact.limiter, &r).await;
        assert_eq!(got, want, "step {step}: {key} {r:?}");
        over += usize::from(got.0 == OVER);
        let ms = if next(50) == 0 { HOUR_MS } else { next(700) };
        exact.clock.advance_ms(ms);
    }
    assert!(over > 300, "the walk runs into the limits: {over} refused");
    assert!(exact.store.exact_buckets.lock().len() <= 3);
}
