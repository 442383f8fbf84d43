//! Hit accounting over gRPC (docs/rules.md, "Decisions"): every hit is counted, admitted or not, as
//! the reference's `INCRBY` (so usage reports that overshoot a budget are charged), unless a
//! limit says `strict: false`; descriptors held back by `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`
//! report their count as it stands; counts saturate and refunds stop at zero, report what they
//! leave and hold nothing back.

use crate::common::{desc, http_async, Server, T0};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;

const RULES: &str = r#"
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: fixed_window}
  - key: lenient
    rate_limit: {unit: minute, requests_per_unit: 1000, strict: false}
  - key: mixed
    rate_limit: {unit: minute, requests_per_unit: 10}
    additional_limits:
      - {unit: hour, requests_per_unit: 20, strict: false}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
"#;

/// One descriptor `(key, value)` with its own `hits_addend`; `refund` sets `is_negative_hits`.
fn hits(key: &str, value: &str, n: u64, refund: bool) -> RateLimitRequest {
    let mut d = desc(&[(key, value)]);
    d.hits_addend = Some(UInt64Value { value: n });
    d.is_negative_hits = refund;
    RateLimitRequest {
        domain: "llm".into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

async fn send(s: &Server, r: RateLimitRequest) -> Vec<DescriptorStatus> {
    let resp = s.client().await.should_rate_limit(r).await.unwrap();
    resp.into_inner().statuses
}

/// `(over, remaining)` of a one-descriptor request.
async fn ask(s: &Server, key: &str, value: &str, n: u64) -> (bool, u32) {
    let st = &send(s, hits(key, value, n, false)).await[0];
    (st.code == Code::OverLimit as i32, st.limit_remaining)
}

#[tokio::test]
async fn a_usage_report_that_overshoots_the_budget_is_charged() {
    let s = Server::start(RULES, |_| {}).await;
    for key in ["tenant", "fixed", "lenient"] {
        // A check (0 tokens), then reports of 600 and 600 against a budget of 1000.
        assert_eq!(ask(&s, key, "a", 0).await, (false, 1000), "{key}");
        assert_eq!(ask(&s, key, "a", 600).await, (false, 400), "{key}");
        assert_eq!(ask(&s, key, "a", 600).await, (true, 0), "{key}");
    }
    // Charged (the reference's INCRBY): 1200 > 1000, so the next check is denied.
    assert_eq!(ask(&s, "tenant", "a", 0).await, (true, 0));
    assert_eq!(ask(&s, "fixed", "a", 0).await, (true, 0));
    // `strict: false` drops the overshooting report: 400 tokens left, forever.
    assert_eq!(ask(&s, "lenient", "a", 0).await, (false, 400));
    // The next minute: the fixed window starts afresh; a sliding window still weighs the
    // previous minute's 1200 (a fifth in: 960 of them, 40 left).
    s.clock.set(T0.plus_millis(60_000 + 12_000));
    assert_eq!(ask(&s, "fixed", "a", 0).await, (false, 1000));
    assert_eq!(ask(&s, "tenant", "a", 0).await, (false, 40));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn an_over_limit_request_still_counts() {
    let s = Server::start(RULES, |_| {}).await;
    // The reference's INCRBY: 3 within, then 2 denied requests that still count, so the
    // count stays over for longer than the admitted hits alone would keep it.
    for _ in 0..3 {
        assert!(!ask(&s, "small", "b", 1).await.0);
    }
    for _ in 0..2 {
        assert_eq!(ask(&s, "small", "b", 1).await, (true, 0));
    }
    // 36 s into the next minute, 40 % of the previous minute still counts: 2 of the 5
    // counted hits, so 1 left. Had the denied 2 not counted, 40 % of 3 would leave 2.
    s.clock.set(T0.plus_millis(60_000 + 36_000));
    assert_eq!(ask(&s, "small", "b", 0).await, (false, 1));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn strict_false_on_an_additional_limit_charges_only_the_others() {
    let s = Server::start(RULES, |_| {}).await;
    // 10 a minute (strict) and 20 an hour (strict: false): 10 admitted, then 5 denied.
    for _ in 0..10 {
        assert!(!ask(&s, "mixed", "m", 1).await.0);
    }
    for _ in 0..5 {
        assert!(ask(&s, "mixed", "m", 1).await.0);
    }
    // Two minutes on the minute limit is clear again, and the hour limit has counted only
    // the 10 admitted hits: 10 more fit (had it charged the 5 denied ones, only 5 would).
    s.clock.set(T0.plus_millis(120_000));
    for n in 0..10 {
        assert!(!ask(&s, "mixed", "m", 1).await.0, "hit {n}");
    }
    assert!(ask(&s, "mixed", "m", 1).await.0, "both limits are spent");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_held_back_descriptor_reports_its_real_remaining() {
    let s = Server::start(RULES, |st| st.options.stop_increment_when_over_limit = true).await;
    assert_eq!(ask(&s, "small", "h", 1).await, (false, 2));
    // `zero` goes over, so `small` is held back: not counted, and it says so — 2 left, not 1.
    let mut r = hits("zero", "z", 1, false);
    r.descriptors
        .push(hits("small", "h", 1, false).descriptors.remove(0));
    let st = send(&s, r).await;
    assert_eq!(st[0].code, Code::OverLimit as i32);
    assert_eq!((st[1].code, st[1].limit_remaining), (Code::Ok as i32, 2));
    assert_eq!(ask(&s, "small", "h", 0).await, (false, 2));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_refund_reports_what_it_leaves_and_holds_nothing_back() {
    let s = Server::start(RULES, |st| st.options.stop_increment_when_over_limit = true).await;
    // `small` (3 a minute) reserved 5: over. A settle gives 3 back in the same request as a
    // charge of 1 on `tenant`: the refund reports the 2 it leaves (within, 1 left), and does
    // not hold the charge back as an over descriptor would.
    assert_eq!(ask(&s, "small", "r", 5).await, (true, 0));
    let mut r = hits("small", "r", 3, true);
    r.descriptors
        .push(hits("tenant", "r", 1, false).descriptors.remove(0));
    let st = send(&s, r).await;
    assert_eq!((st[0].code, st[0].limit_remaining), (Code::Ok as i32, 1));
    assert_eq!((st[1].code, st[1].limit_remaining), (Code::Ok as i32, 999));
    assert_eq!(ask(&s, "tenant", "r", 0).await, (false, 999), "charged");
    assert_eq!(ask(&s, "small", "r", 1).await, (false, 0));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn counts_saturate_and_refunds_stop_at_zero() {
    let s = Server::start(RULES, |_| {}).await;
    for key in ["tenant", "fixed"] {
        assert_eq!(ask(&s, key, "o", 1001).await, (true, 0));
        // 1001 + (2^64 − 101) would wrap to 900: still over, not reset.
        assert_eq!(ask(&s, key, "o", u64::MAX - 100).await, (true, 0), "{key}");
        assert_eq!(ask(&s, key, "o", 0).await, (true, 0), "{key}");
        // A refund of 2^63 (negative as an i64) empties the count; it never adds.
        send(&s, hits(key, "o", 1 << 63, true)).await;
        assert_eq!(ask(&s, key, "o", 0).await, (false, 1000), "{key}");
        send(&s, hits(key, "o", u64::MAX, true)).await;
        assert_eq!(ask(&s, key, "o", 1000).await, (false, 0), "{key}");
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn rlconfig_shows_strict_only_when_off() {
    let s = Server::start(RULES, |_| {}).await;
    let (_, _, rl) = http_async(s.http, "GET", "/rlconfig", "").await.unwrap();
    assert!(
        rl.contains("llm.lenient: unit=MINUTE requests_per_unit=1000 strict=false, shadow_mode"),
        "{rl}"
    );
    assert!(
        rl.contains("llm.mixed: unit=MINUTE requests_per_unit=10, unit=HOUR requests_per_unit=20 strict=false,"),
        "{rl}"
    );
    assert_eq!(rl.matches("strict").count(), 2, "{rl}");
    s.stop().await.unwrap();
}
