//! The response headers over gRPC and `/json`: the draft `RateLimit-*` fields and
//! `Retry-After`, configurable names, the IETF fields and a problem body.

use super::grpc::{ask, h, req, RULES};
use crate::common::{desc, http_async, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use sluice::rls::{HeaderFormat, HeaderNames};

#[tokio::test]
async fn response_headers_and_retry_after() {
    let s = Server::start(RULES, |st| {
        st.options.response_headers = Some(HeaderNames::default())
    })
    .await;
    s.clock.advance_ms(20_000);
    let r = ask(&s, req(vec![desc(&[("k", "a")])])).await;
    assert_eq!(h(&r, "RateLimit-Limit").as_deref(), Some("3"));
    assert_eq!(h(&r, "RateLimit-Remaining").as_deref(), Some("2"));
    assert_eq!(h(&r, "RateLimit-Reset").as_deref(), Some("40"));
    assert_eq!(h(&r, "Retry-After"), None);
    // The most restrictive descriptor is reported: `fixed` has 1 left, `k` 1 left after two
    // more; an over-limit one wins.
    ask(&s, req(vec![desc(&[("k", "a")])])).await;
    let r = ask(
        &s,
        req(vec![
            desc(&[("free", "x")]),
            desc(&[("k", "a")]),
            desc(&[("fixed", "f")]),
        ]),
    )
    .await;
    assert_eq!(h(&r, "RateLimit-Remaining").as_deref(), Some("0"));
    let r = ask(&s, req(vec![desc(&[("fixed", "f")]), desc(&[("k", "a")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        h(&r, "RateLimit-Limit").as_deref(),
        Some("3"),
        "the over-limit descriptor wins"
    );
    assert_eq!(h(&r, "Retry-After").as_deref(), Some("40"));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn header_names_are_configurable() {
    let names = HeaderNames {
        limit: "X-L".into(),
        remaining: "X-R".into(),
        reset: "X-T".into(),
    };
    let s = Server::start(RULES, |st| st.options.response_headers = Some(names)).await;
    let r = ask(&s, req(vec![desc(&[("k", "a")])])).await;
    let keys: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(keys, vec!["X-L", "X-R", "X-T"]);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn ietf_headers_and_a_problem_body_over_grpc_and_json() {
    let s = Server::start(RULES, |st| {
        st.options.response_headers = Some(HeaderNames::default());
        st.options.header_format = HeaderFormat::Ietf;
        st.options.problem_body = true;
    })
    .await;
    s.clock.advance_ms(20_000);
    // A rule's policy is its name, else its path; a limit override's, `<domain>.override`
    // (its path would echo the request's values).
    let mut own = desc(&[("k", "mine")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 50,
        unit: Unit::Hour as i32,
    });
    let r = ask(
        &s,
        req(vec![desc(&[("k", "a")]), desc(&[("general", "g")]), own]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        h(&r, "RateLimit-Policy").as_deref(),
        Some(r#""test.k";q=3;w=60, "general";q=1;w=60, "test.override";q=50;w=3600"#)
    );
    assert_eq!(h(&r, "RateLimit").as_deref(), Some(r#""general";r=0;t=40"#));
    assert_eq!(h(&r, "RateLimit-Limit"), None, "one format at a time");
    assert!(r.raw_body.is_empty());
    // Refused: Retry-After, and the problem body naming the policy over its limit.
    let r = ask(
        &s,
        req(vec![desc(&[("k", "a")]), desc(&[("general", "g")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(h(&r, "RateLimit").as_deref(), Some(r#""general";r=0;t=40"#));
    assert_eq!(h(&r, "Retry-After").as_deref(), Some("40"));
    assert_eq!(
        h(&r, "content-type").as_deref(),
        Some("application/problem+json")
    );
    let problem: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(
        problem,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Quota Exceeded",
            "status": 429,
            "violated-policies": ["general"],
        })
    );
    // POST /json carries the same, the body as proto3 JSON prints bytes (base64).
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"general","value":"g"}]}]}"#;
    let (status, _, text) = http_async(s.http, "POST", "/json", body).await.unwrap();
    assert_eq!(status, 429);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let raw = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        v["rawBody"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&raw).unwrap(),
        problem
    );
    assert!(v["responseHeadersToAdd"].as_array().unwrap().contains(
        &serde_json::json!({"key": "content-type", "value": "application/problem+json"})
    ));
    s.stop().await.unwrap();
}
