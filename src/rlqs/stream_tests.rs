//! Tests of a quota stream over a local limiter and a manual clock: what a report and a
//! refresh send, the counters they share with `ShouldRateLimit`, the bounds, reloads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as Pb};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use prost::Message;

use super::*;
use crate::core::clock::{ManualClock, UnixMillis};
use crate::global::Fleet;
use crate::rlqs::{Config, Quotas, UnknownBuckets};
use crate::rls::{Options, RateLimiter};

const T0: UnixMillis = UnixMillis(1_700_006_400_000);

const RULES: &str = r"
domain: edge
descriptors:
  - key: name
    value: prod
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
";

fn setup(config: Config) -> (Arc<Quotas>, ManualClock) {
    let clock = ManualClock::new(T0);
    let limiter = RateLimiter::local(RULES, Arc::new(clock.clone()), Options::default()).unwrap();
    (Quotas::new(limiter, config, Arc::new(Fleet::new(1))), clock)
}

fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

fn usage(id: BucketId, allowed: u64, denied: u64, elapsed_s: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id),
        time_elapsed: Some(PbDuration {
            seconds: elapsed_s,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: usages,
    }
}

/// The strategy of each action, in order (`None`: an abandon).
fn strategies(actions: &Actions) -> Vec<Option<Pb>> {
    actions
        .to_proto()
        .iter()
        .map(|a| match a.bucket_action.as_ref().unwrap() {
            Action::QuotaAssignmentAction(q) => q.rate_limit_strategy.unwrap().strategy,
            Action::AbandonAction(_) => None,
        })
        .collect()
}

fn is_blanket(s: &Option<Pb>, rule: BlanketRule) -> bool {
    *s == Some(Pb::BlanketRule(rule as i32))
}

fn tokens(s: &Option<Pb>) -> (u32, f64) {
    match s {
        Some(Pb::TokenBucket(t)) => (
            t.max_tokens,
            f64::from(t.tokens_per_fill.unwrap().value) / t.fill_interval.unwrap().seconds as f64,
        ),
        other => panic!("not a token bucket: {other:?}"),
    }
}

#[test]
fn a_first_report_gets_each_bucket_its_assignment() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let msg = report(vec![
        usage(bucket(&[("name", "prod")]), 1, 0, 0),
        usage(bucket(&[("free", "x")]), 1, 0, 0),
        usage(bucket(&[("nothing", "here")]), 1, 0, 0),
    ]);
    let sent = strategies(&s.report(&msg.encode_to_vec(), T0).unwrap());
    assert_eq!(sent.len(), 3);
    let (max, rate) = tokens(&sent[0]);
    // Alone on the counter: the whole room (600 less the one admitted) and rate (10/s).
    assert_eq!(max, 599);
    assert!((9.0..=10.0).contains(&rate), "{rate}");
    assert!(is_blanket(&sent[1], BlanketRule::AllowAll), "unlimited");
    assert!(
        is_blanket(&sent[2], BlanketRule::AllowAll),
        "no rule: the default"
    );
    // The same again, soon after: nothing new to send.
    let again = report(vec![usage(bucket(&[("name", "prod")]), 0, 0, 1)]);
    assert!(s
        .report(&again.encode_to_vec(), T0.plus_millis(1000))
        .unwrap()
        .is_empty());
}

#[test]
fn unknown_buckets_get_the_domains_default() {
    let config = Config {
        unknown: UnknownBuckets::parse("edge=DENY_ALL").unwrap(),
        ..Config::default()
    };
    let (q, _) = setup(config);
    let mut s = Stream::open(&q).unwrap();
    let msg = report(vec![usage(bucket(&[("nothing", "here")]), 0, 0, 0)]);
    let sent = strategies(&s.report(&msg.encode_to_vec(), T0).unwrap());
    assert!(is_blanket(&sent[0], BlanketRule::DenyAll));
}

#[test]
fn reported_usage_counts_in_the_counter_should_rate_limit_uses() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let acme = bucket(&[("tenant", "acme")]);
    s.report(
        &report(vec![usage(acme.clone(), 59, 7, 5)]).encode_to_vec(),
        T0,
    )
    .unwrap();
    let req = |value: &str| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: value.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let limiter = q.limiter().clone();
    let answer = limiter.should_rate_limit(&req("acme")).unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32, "the 60th");
    let answer = limiter.should_rate_limit(&req("acme")).unwrap();
    assert_eq!(
        answer.overall_code,
        Code::OverLimit as i32,
        "59 admitted by Envoy + 1 here: the denied 7 took no room"
    );
    // Another tenant has a counter of its own.
    let answer = limiter.should_rate_limit(&req("other")).unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

#[test]
fn a_full_window_denies_until_its_reset_then_room_returns() {
    let (q, clock) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let acme = bucket(&[("tenant", "acme")]);
    let sent = strategies(
        &s.report(
            &report(vec![usage(acme.clone(), 60, 0, 5)]).encode_to_vec(),
            T0,
        )
        .unwrap(),
    );
    assert!(is_blanket(&sent[0], BlanketRule::DenyAll));
    // The fixed window ends at T0 + 60 s: the deny lasts until then.
    let ttl = |actions: &Actions| match actions.to_proto()[0].bucket_action.as_ref().unwrap() {
        Action::QuotaAssignmentAction(q) => q.assignment_time_to_live.unwrap().seconds,
        Action::AbandonAction(_) => panic!("an abandon"),
    };
    let at = T0.plus_millis(30_000);
    clock.set(at);
    let refreshed = s.refresh(at);
    assert!(refreshed.is_empty(), "nothing changed: {refreshed:?}");
    let at = T0.plus_millis(59_000);
    let renewed = s.refresh(at);
    assert_eq!(
        ttl(&renewed),
        1,
        "renewed for what is left, before it lapses"
    );
    let at = T0.plus_millis(60_000);
    let sent = strategies(&s.refresh(at));
    assert_eq!(tokens(&sent[0]).0, 60, "a new window: the whole limit");
}

#[test]
fn two_streams_split_the_room_by_demand() {
    let (q, _) = setup(Config::default());
    let (mut a, mut b) = (Stream::open(&q).unwrap(), Stream::open(&q).unwrap());
    let prod = || bucket(&[("name", "prod")]);
    a.report(&report(vec![usage(prod(), 0, 0, 0)]).encode_to_vec(), T0)
        .unwrap();
    b.report(&report(vec![usage(prod(), 0, 0, 0)]).encode_to_vec(), T0)
        .unwrap();
    // a wants 9 a second, b 1: together at the limit's 10.
    let at = T0.plus_millis(5000);
    let sa = strategies(
        &a.report(&report(vec![usage(prod(), 45, 0, 5)]).encode_to_vec(), at)
            .unwrap(),
    );
    let sb = strategies(
        &b.report(&report(vec![usage(prod(), 5, 0, 5)]).encode_to_vec(), at)
            .unwrap(),
    );
    let later = at.plus_millis(CACHE_WAIT);
    let ra = a.refresh(later);
    let rb = b.refresh(later);
    // The latest each was sent: the refresh's if it sent one, else the report's.
    let latest = |refreshed: &Actions, reported: &[Option<Pb>]| {
        let r = strategies(refreshed);
        let sent = r.first().or(reported.first()).expect("a share was sent");
        tokens(sent).1
    };
    let (rate_a, rate_b) = (latest(&ra, &sa), latest(&rb, &sb));
    assert!(rate_a > 3.0 * rate_b, "{rate_a} vs {rate_b}");
    assert!(rate_a + rate_b <= 10.0 + 1e-9, "{rate_a} + {rate_b}");
}

/// Past the engine's cache of a split.
const CACHE_WAIT: u64 = 300;

#[test]
fn an_idle_bucket_is_abandoned_and_forgotten() {
    let config = Config {
        abandon_after: Duration::from_secs(60),
        ..Config::default()
    };
    let (q, _) = setup(config);
    let mut s = Stream::open(&q).unwrap();
    s.report(
        &report(vec![usage(bucket(&[("name", "prod")]), 3, 0, 0)]).encode_to_vec(),
        T0,
    )
    .unwrap();
    assert_eq!((q.bucket_count(), q.counter_count()), (1, 1));
    let quiet = report(vec![usage(bucket(&[("name", "prod")]), 0, 0, 5)]);
    s.report(&quiet.encode_to_vec(), T0.plus_millis(30_000))
        .unwrap();
    assert!(strategies(&s.refresh(T0.plus_millis(59_000)))
        .iter()
        .all(Option::is_some));
    let sent = strategies(&s.refresh(T0.plus_millis(60_000)));
    assert_eq!(sent, vec![None], "abandoned");
    assert_eq!((q.bucket_count(), q.counter_count()), (0, 0));
    assert_eq!(
        q.stats.abandons.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn the_bounds_refuse_streams_and_buckets_and_free_them_on_close() {
    let config = Config {
        max_streams: 1,
        max_buckets_per_stream: 2,
        max_buckets: 3,
        ..Config::default()
    };
    let (q, _) = setup(config);
    let mut a = Stream::open(&q).unwrap();
    assert!(matches!(
        Stream::open(&q),
        Err(StreamError::TooManyStreams(1))
    ));
    let many: Vec<_> = (0..5)
        .map(|i| usage(bucket(&[("tenant", &format!("t{i}"))]), 1, 0, 0))
        .collect();
    assert_eq!(
        a.report(&report(many).encode_to_vec(), T0).unwrap().len(),
        2
    );
    assert_eq!(
        a.take_refused(),
        Refused {
            per_stream: 3,
            buckets: 0,
            id_bytes: 0
        }
    );
    assert_eq!(q.bucket_count(), 2);
    drop(a);
    assert_eq!(
        (q.stream_count(), q.bucket_count(), q.counter_count()),
        (0, 0, 0)
    );
    let mut b = Stream::open(&q).unwrap();
    let two: Vec<_> = (0..2)
        .map(|i| usage(bucket(&[("tenant", &format!("u{i}"))]), 1, 0, 0))
        .collect();
    assert_eq!(b.report(&report(two).encode_to_vec(), T0).unwrap().len(), 2);
}

#[test]
fn a_bad_report_is_refused_whole() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let mut bad = usage(bucket(&[("name", "prod")]), 1, 0, 0);
    bad.time_elapsed = None;
    let good = usage(bucket(&[("tenant", "acme")]), 1, 0, 0);
    let e = s
        .report(&report(vec![good, bad]).encode_to_vec(), T0)
        .unwrap_err();
    assert_eq!(e.to_string(), "bucket usage 1: no time_elapsed");
    assert_eq!(q.bucket_count(), 0, "nothing of it taken");
}

#[test]
fn a_reload_moves_buckets_to_their_new_rules() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let acme = bucket(&[("tenant", "acme")]);
    s.report(
        &report(vec![usage(acme.clone(), 1, 0, 0)]).encode_to_vec(),
        T0,
    )
    .unwrap();
    let rules = crate::rules::compile_sources(
        &[(
            "rules.yaml".into(),
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unlimited: true}\n"
                .into(),
        )],
        false,
    )
    .unwrap();
    q.limiter().swap_rules(rules, vec![]);
    let sent = strategies(&s.refresh(T0.plus_millis(1000)));
    assert!(is_blanket(&sent[0], BlanketRule::AllowAll), "{sent:?}");
    assert_eq!(q.counter_count(), 0, "no counter shared any more");
}

#[test]
fn a_report_that_fills_the_room_denies_at_once_however_recent_the_split() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let acme = || bucket(&[("tenant", "acme")]);
    let first = strategies(
        &s.report(&report(vec![usage(acme(), 1, 0, 0)]).encode_to_vec(), T0)
            .unwrap(),
    );
    assert_eq!(tokens(&first[0]).0, 59);
    let full = strategies(
        &s.report(&report(vec![usage(acme(), 59, 0, 1)]).encode_to_vec(), T0)
            .unwrap(),
    );
    assert!(is_blanket(&full[0], BlanketRule::DenyAll), "{full:?}");
}

#[test]
fn a_refresh_sends_a_share_another_members_report_moved_and_nothing_else() {
    let (q, _) = setup(Config::default());
    let (mut a, mut b) = (Stream::open(&q).unwrap(), Stream::open(&q).unwrap());
    let prod = || bucket(&[("name", "prod")]);
    a.report(&report(vec![usage(prod(), 0, 0, 0)]).encode_to_vec(), T0)
        .unwrap();
    b.report(&report(vec![usage(prod(), 0, 0, 0)]).encode_to_vec(), T0)
        .unwrap();
    let at = T0.plus_millis(1000);
    assert!(b.refresh(at).is_empty(), "nothing moved yet");
    // b wants 2 a second (its share: that and half of what is left), then a turns busy (9 a
    // second of the limit's 10): b's share shrinks to its demand.
    let later = T0.plus_millis(5000);
    b.report(
        &report(vec![usage(prod(), 10, 0, 5)]).encode_to_vec(),
        later,
    )
    .unwrap();
    a.report(
        &report(vec![usage(prod(), 45, 0, 5)]).encode_to_vec(),
        later,
    )
    .unwrap();
    let moved = strategies(&b.refresh(later.plus_millis(1)));
    assert_eq!(moved.len(), 1, "b is sent its smaller share");
    assert!(tokens(&moved[0]).1 < 5.0, "{moved:?}");
    assert!(
        b.refresh(later.plus_millis(1000)).is_empty(),
        "then nothing until it moves again"
    );
}

#[test]
fn a_room_filled_between_reports_is_denied_at_the_next_refresh() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let acme = bucket(&[("tenant", "acme")]);
    s.report(&report(vec![usage(acme, 10, 0, 0)]).encode_to_vec(), T0)
        .unwrap();
    assert!(s.refresh(T0.plus_millis(1000)).is_empty(), "nothing moved");
    // ShouldRateLimit (or another replica, through the sync) takes the other 50.
    let limiter = q.limiter().clone();
    for _ in 0..50 {
        let req = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: "acme".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        limiter.should_rate_limit(&req).unwrap();
    }
    let sent = strategies(&s.refresh(T0.plus_millis(2000)));
    assert!(is_blanket(&sent[0], BlanketRule::DenyAll), "{sent:?}");
}

#[test]
fn a_bucket_is_found_again_whatever_its_maps_order() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    // Two maps of the same entries, filled in opposite orders (each with its own hasher, as
    // prost decodes them): one bucket, and a third entry makes another.
    let pairs = [("tenant", "acme"), ("method", "GET"), ("path", "/a")];
    let forward = bucket(&pairs[..2]);
    let backward = bucket(&[pairs[1], pairs[0]]);
    s.report(&report(vec![usage(forward, 1, 0, 0)]).encode_to_vec(), T0)
        .unwrap();
    s.report(
        &report(vec![usage(backward.clone(), 1, 0, 1)]).encode_to_vec(),
        T0,
    )
    .unwrap();
    assert_eq!((s.bucket_count(), q.bucket_count()), (1, 1));
    s.report(
        &report(vec![usage(bucket(&pairs), 1, 0, 0)]).encode_to_vec(),
        T0,
    )
    .unwrap();
    assert_eq!((s.bucket_count(), q.bucket_count()), (2, 2));
}

#[test]
fn an_id_over_its_byte_bound_ends_the_stream_naming_the_setting() {
    let (q, _) = setup(Config {
        max_bucket_id_bytes: 16,
        ..Config::default()
    });
    let mut s = Stream::open(&q).unwrap();
    // 6 + 10 bytes: the bound exactly.
    let fits = usage(bucket(&[("tenant", "acme-12345")]), 1, 0, 0);
    let over = usage(bucket(&[("tenant", "acme-123456")]), 1, 0, 0);
    let e = s
        .report(&report(vec![fits.clone(), over]).encode_to_vec(), T0)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "bucket usage 1: the bucket_id's keys and values are 17 bytes, more than \
         RLQS_MAX_BUCKET_ID_BYTES (16)"
    );
    assert_eq!((q.bucket_count(), q.id_bytes()), (0, 0), "nothing taken");
    assert_eq!(
        s.report(&report(vec![fits]).encode_to_vec(), T0)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(q.id_bytes(), 16);
}

#[test]
fn tracked_ids_are_bounded_in_bytes_every_stream_together_and_freed() {
    let (q, _) = setup(Config {
        max_tracked_id_bytes: 28,
        abandon_after: Duration::from_secs(60),
        ..Config::default()
    });
    let (mut a, mut b) = (Stream::open(&q).unwrap(), Stream::open(&q).unwrap());
    // Ten bytes each ("tenant" and "t-00"): two fit in 28, the third does not.
    let tenants: Vec<_> = (0..3)
        .map(|i| usage(bucket(&[("tenant", &format!("t-0{i}"))]), 1, 0, 0))
        .collect();
    let sent = a.report(&report(tenants).encode_to_vec(), T0).unwrap();
    assert_eq!(sent.len(), 2, "the third bucket gets no assignment");
    assert_eq!(
        a.take_refused(),
        Refused {
            id_bytes: 1,
            ..Refused::default()
        }
    );
    assert_eq!(a.take_refused().to_string(), "", "taken");
    assert_eq!((q.bucket_count(), q.id_bytes()), (2, 20));
    // Another stream's 10 bytes do not fit either; its 8 do, to the byte.
    let other = usage(bucket(&[("tenant", "t-09")]), 1, 0, 0);
    assert!(b
        .report(&report(vec![other.clone()]).encode_to_vec(), T0)
        .unwrap()
        .is_empty());
    let refused = b.take_refused();
    assert_eq!(refused.to_string(), "RLQS_MAX_TRACKED_ID_BYTES: 1");
    let prod = usage(bucket(&[("name", "prod")]), 1, 0, 0);
    let sent = b.report(&report(vec![prod]).encode_to_vec(), T0).unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!((q.bucket_count(), q.id_bytes()), (3, 28));
    // a's buckets go idle and are abandoned: their bytes are free, and b's bucket fits.
    let at = T0.plus_millis(60_000);
    let abandoned = a.refresh(at).to_proto();
    assert_eq!(abandoned.len(), 2);
    assert_eq!(q.id_bytes(), 8);
    let sent = b.report(&report(vec![other]).encode_to_vec(), at).unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(q.id_bytes(), 18);
    // A closed stream frees its buckets' bytes: none leak.
    drop(b);
    assert_eq!((q.bucket_count(), q.id_bytes()), (0, 0));
    let stats = q
        .stats
        .buckets_refused
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(stats, 2);
}

#[test]
fn an_action_carries_the_id_as_reported_and_a_reload_resolves_it_again() {
    let (q, _) = setup(Config::default());
    let mut s = Stream::open(&q).unwrap();
    let id = bucket(&[("tenant", "acme"), ("method", "GET"), ("path", "/a")]);
    let rules = |yaml: &str| {
        crate::rules::compile_sources(&[("rules.yaml".into(), yaml.into())], false).unwrap()
    };
    q.limiter().swap_rules(
        rules(
            "domain: edge\ndescriptors:\n  - key: tenant\n    descriptors:\n      \
             - key: method\n        descriptors:\n          - key: path\n            \
             rate_limit: {unit: minute, requests_per_unit: 60}\n",
        ),
        vec![],
    );
    let sent = s
        .report(
            &report(vec![usage(id.clone(), 1, 0, 0)]).encode_to_vec(),
            T0,
        )
        .unwrap()
        .to_proto();
    assert_eq!(sent[0].bucket_id.as_ref(), Some(&id));
    // The new rules are read against the id the stream kept.
    q.limiter().swap_rules(
        rules(
            "domain: edge\ndescriptors:\n  - key: tenant\n    descriptors:\n      \
             - key: method\n        descriptors:\n          - key: path\n            \
             rate_limit: {unit: minute, requests_per_unit: 6}\n",
        ),
        vec![],
    );
    let sent = s.refresh(T0.plus_millis(1000));
    assert_eq!(sent.to_proto()[0].bucket_id.as_ref(), Some(&id));
    assert!(tokens(&strategies(&sent)[0]).0 <= 6, "{sent:?}");
}
