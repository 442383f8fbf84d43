//! Tests of [`RateLimiter::explain`] on the limiter itself: `replaces`, a limit the request
//! supplies, a refund, `hits_addend` 0, and exact rules read from the store without counting
//! (or from memory, said so, when the store fails).

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;

use super::*;
use crate::core::clock::ManualClock;
use crate::global::memory::MemoryStore;
use crate::global::{ExactClient, Fleet, ShardRouter, SyncQueues};
use crate::rls::{GlobalMode, Options};

/// The start of a minute.
const T0: UnixMillis = UnixMillis(1_700_006_400_000);

const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1, name: narrow}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 10, replaces: [{name: narrow}]}\n  - key: e\n    rate_limit: {unit: minute, requests_per_unit: 2, exact: true}\n";

fn desc(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

fn req(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    }
}

fn local() -> Arc<RateLimiter> {
    RateLimiter::local(RULES, Arc::new(ManualClock::new(T0)), Options::default()).unwrap()
}

/// A limiter in global mode whose exact rules go to `stores` (none: every call fails).
fn global(stores: Vec<Arc<MemoryStore>>) -> Arc<RateLimiter> {
    let rules = crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
    let names = vec!["memory".to_string()];
    let stores = stores
        .into_iter()
        .map(|s| s as Arc<dyn crate::global::ExactStore>)
        .collect();
    let client = ExactClient::new(stores, ShardRouter::new(&names), Duration::from_millis(100));
    let global = GlobalMode {
        queues: Arc::new(SyncQueues::new(ShardRouter::new(&names), 1, 10_000)),
        fleet: Arc::new(Fleet::new(1)),
        exact: Some(client),
    };
    let telemetry = Arc::new(crate::telemetry::Telemetry::new().unwrap());
    RateLimiter::new(
        rules,
        vec![],
        Arc::new(ManualClock::new(T0)),
        Options::default(),
        telemetry,
        EntityTable::new(Options::default().cache),
        Some(global),
    )
}

#[tokio::test]
async fn a_replaced_rule_counts_for_nothing_and_says_by_which() {
    let l = local();
    l.should_rate_limit(&req(vec![desc("a", "x")])).unwrap();
    // Alone, `a` is at its limit: the next hit would go over.
    let alone = l.explain(&req(vec![desc("a", "x")])).await.unwrap();
    assert_eq!(alone.overall_code, "OVER_LIMIT");
    // Beside `b`, which replaces it, it is not checked at all.
    let both = l
        .explain(&req(vec![desc("a", "x"), desc("b", "x")]))
        .await
        .unwrap();
    let a = &both.descriptors[0];
    assert_eq!(a.replaced_by.as_deref(), Some("d.b"));
    assert!(a.limits.is_empty());
    assert_eq!((a.decision, both.overall_code), ("OK", "OK"));
    assert_eq!(both.descriptors[1].limits[0].decision, "OK");
}

#[tokio::test]
async fn a_request_limit_a_refund_and_zero_hits_are_explained_as_requests_read_them() {
    let l = local();
    let mut supplied = desc("any", "v");
    supplied.limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: 2, // MINUTE
    });
    let mut refund = desc("a", "x");
    refund.is_negative_hits = true;
    let mut zero = desc("a", "y");
    zero.hits_addend = Some(UInt64Value { value: 0 });
    l.should_rate_limit(&req(vec![desc("a", "y")])).unwrap();
    let e = l.explain(&req(vec![supplied, refund, zero])).await.unwrap();
    let rule = e.descriptors[0].rule.as_ref().unwrap();
    assert!(matches!(rule.source, SourceJson::Request { request: true }));
    assert_eq!(e.descriptors[0].limits[0].requests_per_unit, 7);
    assert!(e.descriptors[1].refund);
    assert_eq!(e.descriptors[1].decision, "OK", "a refund is never over");
    // At its limit of 1, but 0 hits fit.
    let z = &e.descriptors[2];
    assert_eq!((z.hits, z.limits[0].count, z.decision), (0, 1, "OK"));
    assert_eq!(l.entity_count(), 1, "only the counted `a=y` has an entity");
}

#[tokio::test]
async fn exact_rules_are_read_from_the_store_without_counting() {
    let store = Arc::new(MemoryStore::default());
    let l = global(vec![store.clone()]);
    let r = req(vec![desc("e", "x")]);
    l.should_rate_limit_async(&r).await.unwrap();
    for _ in 0..3 {
        let e = l.explain(&r).await.unwrap();
        let d = &e.descriptors[0];
        assert_eq!(d.rule.as_ref().unwrap().exact.as_deref(), Some("store"));
        assert_eq!((d.limits[0].count, d.limits[0].remaining), (1, 1));
        assert_eq!(d.decision, "OK");
    }
    // The second real hit is the second counted: at the limit, not over it.
    let resp = l.should_rate_limit_async(&r).await.unwrap();
    assert_eq!(resp.statuses[0].limit_remaining, 0);
    assert_eq!(resp.overall_code, 1, "OK");
    let e = l.explain(&r).await.unwrap();
    assert_eq!(e.descriptors[0].limits[0].count, 2);
    assert_eq!(e.overall_code, "OVER_LIMIT");
}

#[tokio::test]
async fn exact_rules_fall_back_to_memory_and_say_so_when_the_store_fails() {
    let l = global(vec![]);
    let e = l.explain(&req(vec![desc("e", "x")])).await.unwrap();
    let note = e.descriptors[0]
        .rule
        .as_ref()
        .unwrap()
        .exact
        .clone()
        .unwrap();
    assert!(
        note.starts_with("memory (the store did not answer"),
        "{note}"
    );
    assert_eq!(e.descriptors[0].limits[0].count, 0);
    assert_eq!(l.entity_count(), 0);
}
