//! Tests of the engine's grants to young streams over a local limiter: a cold bucket's first
//! assignments, reported by several Envoys at once, stay within the room together.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy as Pb;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use prost::Message;

use crate::core::clock::{ManualClock, UnixMillis};
use crate::global::Fleet;
use crate::rlqs::{Config, Quotas, Stream};
use crate::rls::{Options, RateLimiter};

const T0: UnixMillis = UnixMillis(1_700_006_400_000);

const RULES: &str = r"
domain: edge
descriptors:
  - key: name
    value: prod
    rate_limit: {unit: minute, requests_per_unit: 600}
";

/// A first report of `name=prod` (one request admitted, `time_elapsed` 0).
fn first_report() -> RateLimitQuotaUsageReports {
    let bucket: HashMap<String, String> = [("name".to_string(), "prod".to_string())].into();
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: Some(PbDuration::default()),
            num_requests_allowed: 1,
            num_requests_denied: 0,
        }],
    }
}

/// The capacity of the token bucket a report got.
fn capacity(s: &mut Stream) -> u32 {
    let actions = s.report(&first_report().encode_to_vec(), T0).unwrap();
    match actions.to_proto()[0].bucket_action.as_ref().unwrap() {
        Action::QuotaAssignmentAction(q) => match q.rate_limit_strategy.unwrap().strategy {
            Some(Pb::TokenBucket(t)) => t.max_tokens,
            other => panic!("not a token bucket: {other:?}"),
        },
        Action::AbandonAction(_) => panic!("an abandon"),
    }
}

#[test]
fn a_cold_buckets_first_grants_stay_within_the_room_together() {
    let clock = ManualClock::new(T0);
    let limiter = RateLimiter::local(RULES, Arc::new(clock), Options::default()).unwrap();
    let q = Quotas::new(limiter, Config::default(), Arc::new(Fleet::new(1)));
    let mut streams: Vec<Stream> = (0..4).map(|_| Stream::open(&q).unwrap()).collect();
    // Four Envoys' first reports, one after the other, before any has a rate: each gets an
    // even part of the room among the four streams open, not the room left by the ones
    // before it (599, then 299, 199, 149: twice the limit together).
    let caps: Vec<u32> = streams.iter_mut().map(capacity).collect();
    assert!(caps.iter().all(|&c| c <= 150), "{caps:?}");
    assert!(caps.iter().sum::<u32>() <= 600, "{caps:?}");
    assert!(
        caps.iter().all(|&c| c >= 140),
        "an even part each: {caps:?}"
    );
}
