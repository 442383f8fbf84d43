//! The real server on loopback (in process, manual clock) driven by a gRPC client: every RLS
//! semantic of docs/wire.md, health and reflection. (Its HTTP port: `http_endpoints.rs`; the
//! response headers: `headers.rs`.)

use crate::common::{desc, http_async, Server, T0};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

/// Shared with `http_endpoints.rs`, whose `/readyz` and `/rlconfig` count these rules.
pub(crate) const RULES: &str = r#"
domain: test
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: white
    value: listed
  - key: parent
    value: p
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: general
    rate_limit: {name: general, unit: minute, requests_per_unit: 1}
  - key: special
    rate_limit:
      name: special
      unit: minute
      requests_per_unit: 10
      replaces: [{name: general}]
  - key: multi
    rate_limit: {unit: second, requests_per_unit: 5}
    additional_limits:
      - {unit: minute, requests_per_unit: 7}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
"#;

pub(crate) fn req(descs: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "test".into(),
        descriptors: descs,
        hits_addend: 0,
    }
}

pub(crate) async fn ask(s: &Server, r: RateLimitRequest) -> RateLimitResponse {
    s.client()
        .await
        .should_rate_limit(r)
        .await
        .unwrap()
        .into_inner()
}

async fn one(s: &Server, entries: &[(&str, &str)]) -> (Code, DescriptorStatus) {
    let r = ask(s, req(vec![desc(entries)])).await;
    (
        Code::try_from(r.overall_code).unwrap(),
        r.statuses[0].clone(),
    )
}

fn code(st: &DescriptorStatus) -> Code {
    Code::try_from(st.code).unwrap()
}

/// The value of the response header `name`, if any.
pub(crate) fn h(r: &RateLimitResponse, name: &str) -> Option<String> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.clone())
}

fn reset(st: &DescriptorStatus) -> i64 {
    st.duration_until_reset.as_ref().unwrap().seconds
}

#[tokio::test]
async fn limited_descriptor_counts_down_then_goes_over() {
    let s = Server::start(RULES, |_| {}).await;
    for left in [2, 1, 0] {
        let (overall, st) = one(&s, &[("k", "a")]).await;
        assert_eq!(
            (overall, code(&st), st.limit_remaining),
            (Code::Ok, Code::Ok, left)
        );
        let l = st.current_limit.clone().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (3, Unit::Minute as i32));
        assert_eq!(reset(&st), 60);
    }
    let (overall, st) = one(&s, &[("k", "a")]).await;
    assert_eq!(
        (overall, code(&st), st.limit_remaining),
        (Code::OverLimit, Code::OverLimit, 0)
    );
    // Another value of a key-only rule has its own counter.
    assert_eq!(one(&s, &[("k", "b")]).await.0, Code::Ok);
    // Reset counts down with the clock, windows aligned to the epoch.
    s.clock.advance_ms(45_500);
    assert_eq!(reset(&one(&s, &[("k", "c")]).await.1), 15);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn sliding_window_weights_the_previous_minute() {
    let s = Server::start(RULES, |_| {}).await;
    for _ in 0..3 {
        assert_eq!(one(&s, &[("k", "a")]).await.0, Code::Ok);
    }
    // Two thirds into the next minute, a third of the previous 3 still counts: 1, so 2 fit.
    s.clock.set(T0.plus_millis(60_000 + 40_000));
    assert_eq!(one(&s, &[("k", "a")]).await.1.limit_remaining, 1);
    assert_eq!(one(&s, &[("k", "a")]).await.1.limit_remaining, 0);
    assert_eq!(one(&s, &[("k", "a")]).await.0, Code::OverLimit);
    // Fixed windows reset at the boundary instead.
    for _ in 0..3 {
        one(&s, &[("fixed", "x")]).await;
    }
    s.clock.set(T0.plus_millis(120_000));
    assert_eq!(one(&s, &[("fixed", "x")]).await.1.limit_remaining, 1);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn hits_addend_rules() {
    let s = Server::start(RULES, |_| {}).await;
    // Request-level 0 (what Envoy sends) counts 1; 2 counts 2.
    let mut r = req(vec![desc(&[("k", "h")])]);
    assert_eq!(ask(&s, r.clone()).await.statuses[0].limit_remaining, 2);
    r.hits_addend = 2;
    assert_eq!(ask(&s, r.clone()).await.statuses[0].limit_remaining, 0);
    // A descriptor's own 0 checks without counting, even with a request-level addend.
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    r.hits_addend = 5;
    let resp = ask(&s, r.clone()).await;
    assert_eq!(
        (resp.overall_code, resp.statuses[0].limit_remaining),
        (Code::Ok as i32, 0)
    );
    // A descriptor's own addend wins over the request's.
    let mut r2 = req(vec![desc(&[("k", "h2")])]);
    r2.hits_addend = 1;
    r2.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    assert_eq!(ask(&s, r2.clone()).await.statuses[0].limit_remaining, 0);
    assert_eq!(ask(&s, r2).await.overall_code, Code::OverLimit as i32);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn statuses_without_a_limit() {
    let s = Server::start(RULES, |_| {}).await;
    let none = |st: &DescriptorStatus| {
        code(st) == Code::Ok && st.current_limit.is_none() && st.limit_remaining == 0
    };
    // Unknown domain.
    let r = ask(
        &s,
        RateLimitRequest {
            domain: "nope".into(),
            descriptors: vec![desc(&[("k", "a")])],
            hits_addend: 0,
        },
    )
    .await;
    assert!(none(&r.statuses[0]) && r.overall_code == Code::Ok as i32);
    // Whitelisted node, unknown key, parent-only (the limit is on the child), too deep.
    for entries in [
        vec![("white", "listed")],
        vec![("unknown", "x")],
        vec![("parent", "p")],
        vec![("k", "a"), ("extra", "b")],
    ] {
        let (_, st) = one(&s, &entries).await;
        assert!(none(&st), "{entries:?}: {st:?}");
    }
    // Nested match.
    let (_, st) = one(&s, &[("parent", "p"), ("child", "c")]).await;
    assert_eq!(st.current_limit.unwrap().requests_per_unit, 5);
    // Unlimited.
    let (_, st) = one(&s, &[("free", "x")]).await;
    assert_eq!((code(&st), st.limit_remaining), (Code::Ok, u32::MAX));
    assert!(st.current_limit.is_none());
    // Statuses come in request order.
    let r = ask(
        &s,
        req(vec![
            desc(&[("free", "x")]),
            desc(&[("zero", "z")]),
            desc(&[("white", "listed")]),
        ]),
    )
    .await;
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        codes,
        vec![Code::Ok as i32, Code::OverLimit as i32, Code::Ok as i32]
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn zero_limit_always_denies() {
    let s = Server::start(RULES, |_| {}).await;
    for _ in 0..3 {
        assert_eq!(one(&s, &[("zero", "z")]).await.0, Code::OverLimit);
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn shadow_mode_rule_reports_ok() {
    let s = Server::start(RULES, |_| {}).await;
    one(&s, &[("shadow", "a")]).await;
    let (overall, st) = one(&s, &[("shadow", "a")]).await;
    assert_eq!(
        (overall, code(&st), st.limit_remaining),
        (Code::Ok, Code::Ok, 0)
    );
    let (_, _, metrics) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        metrics.contains(r#"ratelimit_shadow_mode_total{domain="test",rule="test.shadow"} 1"#),
        "{metrics}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn global_shadow_mode_keeps_descriptor_statuses() {
    let s = Server::start(RULES, |st| st.options.shadow_mode = true).await;
    let (overall, st) = one(&s, &[("zero", "z")]).await;
    assert_eq!((overall, code(&st)), (Code::Ok, Code::OverLimit));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn quota_mode_fails_only_when_every_quota_is_over() {
    let s = Server::start(RULES, |_| {}).await;
    // Use up quota_a; quota_b still has room: OK overall, quota_a's own status over.
    one(&s, &[("quota_a", "x")]).await;
    let r = ask(
        &s,
        req(vec![desc(&[("quota_a", "x")]), desc(&[("quota_b", "x")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    // Both over: OVER_LIMIT.
    let r = ask(
        &s,
        req(vec![desc(&[("quota_a", "x")]), desc(&[("quota_b", "x")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // A non-quota descriptor over fails the request whatever the quotas say.
    let r = ask(
        &s,
        req(vec![desc(&[("quota_b", "fresh")]), desc(&[("zero", "z")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn global_quota_mode_treats_every_rule_as_a_quota() {
    let s = Server::start(RULES, |st| st.options.quota_mode = true).await;
    let r = ask(&s, req(vec![desc(&[("zero", "z")]), desc(&[("k", "a")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "one quota still has room");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn replaces_drops_the_named_limit_for_that_request_only() {
    let s = Server::start(RULES, |_| {}).await;
    for _ in 0..3 {
        let r = ask(
            &s,
            req(vec![desc(&[("general", "u")]), desc(&[("special", "u")])]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.statuses[0].current_limit.is_none(), "general is replaced");
        assert_eq!(
            r.statuses[1].current_limit.as_ref().unwrap().name,
            "special"
        );
    }
    // The replaced limit's counter was untouched: its one hit is still available.
    let (overall, st) = one(&s, &[("general", "u")]).await;
    assert_eq!((overall, st.limit_remaining), (Code::Ok, 0));
    assert_eq!(st.current_limit.unwrap().name, "general");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn limit_override_applies_to_known_domains() {
    let s = Server::start(RULES, |_| {}).await;
    let mut d = desc(&[("anything", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Second as i32,
    });
    let r = ask(&s, req(vec![d.clone()])).await;
    let l = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (l.requests_per_unit, l.unit, l.name.as_str()),
        (1, Unit::Second as i32, "")
    );
    assert_eq!(
        ask(&s, req(vec![d.clone()])).await.overall_code,
        Code::OverLimit as i32
    );
    // Unknown domain: no limit at all.
    let r = ask(
        &s,
        RateLimitRequest {
            domain: "nope".into(),
            descriptors: vec![d],
            hits_addend: 0,
        },
    )
    .await;
    assert!(r.statuses[0].current_limit.is_none());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn stop_increment_when_over_limit_spares_the_others() {
    for (flag, third) in [(true, Code::Ok), (false, Code::OverLimit)] {
        let s = Server::start(RULES, |st| st.options.stop_increment_when_over_limit = flag).await;
        // A request with one descriptor over: with the flag, `k` is not counted.
        let r = ask(&s, req(vec![desc(&[("zero", "z")]), desc(&[("k", "b")])])).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        one(&s, &[("k", "b")]).await;
        one(&s, &[("k", "b")]).await;
        assert_eq!(one(&s, &[("k", "b")]).await.0, third, "flag {flag}");
        s.stop().await.unwrap();
    }
}

#[tokio::test]
async fn several_limits_report_the_most_restrictive() {
    let s = Server::start(RULES, |_| {}).await;
    for _ in 0..5 {
        one(&s, &[("multi", "m")]).await;
    }
    let (overall, st) = one(&s, &[("multi", "m")]).await;
    assert_eq!(overall, Code::OverLimit);
    assert_eq!(
        st.current_limit.unwrap().unit,
        Unit::Second as i32,
        "the second limit is over"
    );
    // 2 s on, the second window is clear; the minute limit (7) counted 5, the denied 6th, this.
    s.clock.advance_ms(2_000);
    let (_, st) = one(&s, &[("multi", "m")]).await;
    let l = st.current_limit.unwrap();
    assert_eq!(
        (l.unit, l.requests_per_unit, st.limit_remaining),
        (Unit::Minute as i32, 7, 0)
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_invalid_argument() {
    let s = Server::start(RULES, |st| {
        st.options.max_descriptors = 2;
        st.options.max_value_bytes = 16;
    })
    .await;
    let mut c = s.client().await;
    let cases = [
        (
            RateLimitRequest {
                domain: String::new(),
                descriptors: vec![desc(&[("k", "a")])],
                hits_addend: 0,
            },
            "domain",
        ),
        (req(vec![]), "descriptor"),
        (req(vec![desc(&[("k", "a")]); 3]), "too many descriptors"),
        (req(vec![desc(&[("k", &"x".repeat(17))])]), "bytes"),
    ];
    for (r, want) in cases {
        let e = c.should_rate_limit(r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(want), "{}", e.message());
    }
    // The server is still fine.
    assert_eq!(one(&s, &[("k", "a")]).await.0, Code::Ok);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn concurrent_clients_admit_exactly_the_limit() {
    let rules = "domain: test\ndescriptors:\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let s = Server::start(rules, |_| {}).await;
    let admitted = s
        .admitted_by_concurrent_clients(req(vec![desc(&[("c", "shared")])]), 8, 40)
        .await;
    assert_eq!(admitted, 100);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn grpc_health_and_reflection() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let s = Server::start(RULES, |_| {}).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    // "ratelimit": the name envoyproxy/ratelimit's health service answers for.
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        assert_eq!(r.get_ref().status, 1, "{service:?} SERVING");
    }
    let mut refl = ServerReflectionClient::new(channel);
    let ask = |m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let reqs = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".into(),
        )),
    ];
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(reqs))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        stream.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_string()),
        "{names:?}"
    );
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        stream.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected file descriptors")
    };
    assert!(!files.file_descriptor_proto.is_empty());
    s.stop().await.unwrap();
}
