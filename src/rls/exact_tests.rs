//! Tests of the exact path over the in-memory store: all or nothing, keys known over, the prior
//! when the store fails, and token buckets beside windows.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{rate_limit_response::Code, RateLimitRequest};

use super::*;
use crate::core::clock::ManualClock;
use crate::global::memory::MemoryStore;
use crate::global::{ExactClient, ShardRouter, SyncQueues};
use crate::rls::Options;

/// The start of a minute.
const T0: UnixMillis = UnixMillis(1_700_006_400_000);

const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window, exact: true}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, exact: true}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 10, exact: true}\n";

struct Fixture {
    limiter: Arc<RateLimiter>,
    store: Arc<MemoryStore>,
    queues: Arc<SyncQueues>,
    clock: ManualClock,
}

fn fixture() -> Fixture {
    let rules = crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
    let names = vec!["memory".to_string()];
    let queues = Arc::new(SyncQueues::new(ShardRouter::new(&names), 1, 10_000));
    let clock = ManualClock::new(T0);
    let telemetry = Arc::new(crate::telemetry::Telemetry::new().unwrap());
    let limiter = RateLimiter::new(
        rules,
        vec![],
        Arc::new(clock.clone()),
        Options::default(),
        telemetry,
        Some(queues.clone()),
    );
    let store = Arc::new(MemoryStore::default());
    let client = ExactClient::new(
        vec![store.clone()],
        ShardRouter::new(&names),
        Duration::from_millis(100),
    );
    limiter.set_exact(client);
    Fixture {
        limiter,
        store,
        queues,
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
async fn a_key_known_to_be_over_is_answered_from_memory_until_its_window_moves() {
    let f = fixture();
    for _ in 0..2 {
        assert_eq!(ask(&f, &["a"]).await[0].0, OK);
    }
    assert_eq!(ask(&f, &["a"]).await[0].0, OVER);
    let calls = f.store.exact_calls.load(Ordering::Relaxed);
    assert_eq!(calls, 3);
    assert_eq!(f.limiter.over.len(), 1);
    // Over again, with no store call, until the minute ends; `c` alone still calls.
    f.clock.advance_ms(59_999);
    for _ in 0..5 {
        assert_eq!(ask(&f, &["a", "c"]).await, vec![(OVER, 0), (OK, 9)]);
    }
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls);
    assert_eq!(stored(&f), vec![2]);
    let stats = f.limiter.exact.get().unwrap().stats.clone();
    assert_eq!(stats.from_memory.load(Ordering::Relaxed), 5);
    // The next window: asked again, and admitted.
    f.clock.advance_ms(1);
    assert_eq!(ask(&f, &["a"]).await, vec![(OK, 1)]);
    assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 1);
}

#[tokio::test]
async fn with_the_store_down_the_prior_decides_on_this_replicas_share() {
    let f = fixture();
    f.queues.set_live_replicas(4);
    f.store.down.store(true, Ordering::Relaxed);
    // `c` allows 10 a minute: this replica's share of 4 is 1.05 × 10 / 4, 2 whole hits.
    // The statuses report the rule's own limit, as every decision from memory does.
    assert_eq!(ask(&f, &["c"]).await, vec![(OK, 9)]);
    assert_eq!(ask(&f, &["c"]).await, vec![(OK, 8)]);
    assert_eq!(ask(&f, &["c"]).await, vec![(OVER, 0)]);
    let stats = f.limiter.exact.get().unwrap().stats.clone();
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
        Some(f.queues.clone()),
    );
    limiter.set_exact(client);
    let r = limiter
        .should_rate_limit_async(&req(&["b", other]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK, "the prior admits");
    // `b`'s shard counted, then gave it back: the store holds nothing for it.
    let held: u64 = stores[up].exact.lock().values().sum();
    assert_eq!(held, 0);
    let stats = limiter.exact.get().unwrap().stats.clone();
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
