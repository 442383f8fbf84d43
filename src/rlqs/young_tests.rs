//! Tests of young streams' grants on a short window: the arithmetic of a first epoch's
//! parts, and, over a local limiter on a manual clock, first grants that keep a 50/s window's
//! first second within its limit and give way to the steady share as the epoch ends.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy as Pb;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use prost::Message;

use super::*;
use crate::core::clock::{Clock, ManualClock};
use crate::global::Fleet;
use crate::rlqs::{Actions, Config, Stream};
use crate::rls::{Options, RateLimiter};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn ledger(pool: f64, here: u64, claimed: f64, unseen: u64) -> Ledger {
    Ledger {
        slack: 1.0,
        pool,
        here,
        claimed,
        unseen,
        budget: pool - claimed,
        others: 0.0,
    }
}

#[test]
fn a_lone_stream_gets_the_room_its_first_request_left() {
    // A limit of 50, its first request counted: 49 left, all of it its part.
    assert!(close(part(&ledger(50.0, 1, 1.0, 0)), 49.0));
}

#[test]
fn streams_not_seen_yet_keep_an_even_part_and_their_first_request() {
    // Two streams open, one seen: an even part of what both first requests leave (24 each),
    // whatever the first one could take.
    let first = ledger(50.0, 2, 1.0, 1);
    assert!(close(part(&first), 24.0));
    // The second, after the first's 24 and both first requests (counted: 48 left, of which
    // the first's bucket may still take 24): its 24, no more.
    let second = Ledger {
        budget: 48.0,
        others: 24.0,
        ..ledger(50.0, 2, 1.0 + 24.0 + 1.0, 0)
    };
    assert!(close(part(&second), 24.0));
    // The slack lets each take up to a tenth more, and both together no more than that.
    let slack = |l: Ledger| part(&Ledger { slack: 1.1, ..l });
    assert!(close(slack(first), 26.4));
    let after = Ledger {
        budget: 48.0,
        others: 26.4,
        ..ledger(50.0, 2, 1.0 + 26.4 + 1.0, 0)
    };
    assert!(close(slack(after), 26.4));
}

#[test]
fn a_stream_joining_settled_ones_gets_what_their_grants_leave() {
    // Its pool would give it 9, but the count leaves 20 and the others' buckets may still
    // take 18 before the epoch ends: 2.
    let l = Ledger {
        budget: 20.0,
        others: 18.0,
        ..ledger(50.0, 5, 1.0, 0)
    };
    assert!(close(part(&l), 2.0));
    // Nothing left: no part (its grant is then a token, see `first_in_epoch`).
    let none = Ledger { others: 30.0, ..l };
    assert!(close(part(&none), 0.0));
}

#[test]
fn a_first_grant_holds_its_part_at_once_and_refills_what_is_left() {
    // A part of 24.5 with 800 ms left: 24 at once, the half token over 0.8 s.
    let (tokens, rate) = first_in_epoch(24.5, 50, 25.0, 800);
    assert_eq!(tokens, 24);
    assert!(close(rate, 0.625));
    // Held to the capacity it would get otherwise, the rest as rate up to its prior.
    let (tokens, rate) = first_in_epoch(30.0, 20, 25.0, 500);
    assert_eq!((tokens, rate), (20, 20.0));
    assert_eq!(first_in_epoch(300.0, 20, 25.0, 500), (20, 25.0));
    // Less than a token: one, refilled as good as never.
    assert_eq!(first_in_epoch(0.4, 20, 25.0, 500), (1, 0.0));
}

#[test]
fn what_a_grant_may_still_take_counts_its_refill_within_the_epoch() {
    let g = Grant {
        tokens: 10,
        used: 4,
        rate: 5.0,
        at: UnixMillis(1_000),
    };
    // Handed 10 at 1 s, 4 spent: 6, and 5 a second until the epoch's end at 2 s.
    assert!(close(until_end(&g, UnixMillis(2_000), 1_000), 11.0));
    // Handed before the epoch began (1.5 s to 2.5 s): its refill over the epoch alone.
    assert!(close(until_end(&g, UnixMillis(2_500), 1_000), 11.0));
}

const T0: UnixMillis = UnixMillis(1_700_006_400_000);

const RULES: &str = r"
domain: edge
descriptors:
  - key: name
    value: prod
    rate_limit: {unit: second, requests_per_unit: 50}
";

fn report(allowed: u64, elapsed_s: i64) -> Vec<u8> {
    let bucket: HashMap<String, String> = [("name".to_string(), "prod".to_string())].into();
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: Some(PbDuration {
                seconds: elapsed_s,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }],
    }
    .encode_to_vec()
}

/// The token bucket of the actions' one assignment: (capacity, tokens a second).
fn bucket_of_actions(actions: &Actions) -> (u32, f64) {
    let action = actions.to_proto().pop().expect("an action");
    match action.bucket_action {
        Some(Action::QuotaAssignmentAction(q)) => match q.rate_limit_strategy.unwrap().strategy {
            Some(Pb::TokenBucket(t)) => {
                let fill = t.fill_interval.unwrap().seconds as f64;
                (
                    t.max_tokens,
                    f64::from(t.tokens_per_fill.unwrap().value) / fill,
                )
            }
            other => panic!("not a token bucket: {other:?}"),
        },
        other => panic!("not an assignment: {other:?}"),
    }
}

#[test]
fn a_per_second_windows_first_grants_keep_its_first_second_within_the_limit() {
    let clock = ManualClock::new(T0);
    let limiter = RateLimiter::local(RULES, Arc::new(clock.clone()), Options::default()).unwrap();
    let q = Quotas::new(limiter, Config::default(), Arc::new(Fleet::new(1)));
    let (mut a, mut b) = (Stream::open(&q).unwrap(), Stream::open(&q).unwrap());
    // Two Envoys' first requests, 10 ms into the second: each may take what its bucket
    // holds and refills before the second ends, and together with their first requests
    // that is the limit, give or take the slack (the old first grant was the room at once
    // and the whole rate: 49 + 50).
    clock.set(UnixMillis(T0.0 + 10));
    let (ca, ra) = bucket_of_actions(&a.report(&report(1, 0), clock.now()).unwrap());
    let (cb, rb) = bucket_of_actions(&b.report(&report(1, 0), clock.now()).unwrap());
    let most = 2.0 + f64::from(ca + cb) + (ra + rb) * 0.99;
    assert!((48.0..=53.0).contains(&most), "{ca}+{ra}/s, {cb}+{rb}/s");
    assert!(ca.abs_diff(cb) <= 1, "even parts: {ca}, {cb}");
    // Each stream looks again as the second ends, and gets its share of the rate then.
    let end = UnixMillis(T0.0 + 1_000);
    assert_eq!((a.wake_at(), b.wake_at()), (Some(end), Some(end)));
    clock.set(end);
    let (_, ra) = bucket_of_actions(&a.refresh(clock.now()));
    let (_, rb) = bucket_of_actions(&b.refresh(clock.now()));
    assert!(close(ra, 25.0) && close(rb, 25.0), "{ra}, {rb}");
    assert_eq!((a.wake_at(), b.wake_at()), (None, None));
}

#[test]
fn a_lone_stream_holds_the_room_at_once_and_nothing_more() {
    let clock = ManualClock::new(T0);
    let limiter = RateLimiter::local(RULES, Arc::new(clock.clone()), Options::default()).unwrap();
    let q = Quotas::new(limiter, Config::default(), Arc::new(Fleet::new(1)));
    let mut s = Stream::open(&q).unwrap();
    clock.set(UnixMillis(T0.0 + 200));
    let (c, r) = bucket_of_actions(&s.report(&report(1, 0), clock.now()).unwrap());
    // 49 at once, no more before the second ends (one token an hour, Envoy's nearest to
    // none).
    assert_eq!(c, 49);
    assert!(r * 0.8 < 0.01, "{r}");
}
