//! `USE_PROMETHEUS`: the reference's metric names on a listener of their own, beside
//! sluice's `/metrics`.

use crate::common::{desc, free_port, http_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::telemetry::prometheus_ref::PrometheusSettings;

#[tokio::test]
async fn the_references_names_are_served_on_their_own_port() {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let rules = "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let s = Server::start(rules, |st| {
        st.prometheus = Some(PrometheusSettings {
            addr,
            path: "/stats".into(),
        })
    })
    .await;
    let mut c = s.client().await;
    for _ in 0..3 {
        c.should_rate_limit(RateLimitRequest {
            domain: "p".into(),
            descriptors: vec![desc(&[("k", "v")])],
            hits_addend: 0,
        })
        .await
        .unwrap();
    }
    let (status, _, text) = http_async(addr, "GET", "/stats", "").await.unwrap();
    assert_eq!(status, 200);
    for line in [
        r#"ratelimit_service_rate_limit_total_hits{domain="p",key1="k"} 3"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="p",key1="k"} 2"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="p",key1="k"} 1"#,
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 3"#,
        r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 3"#,
        r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"} 3"#,
        r#"ratelimit_service_should_rate_limit_error{err_type="service_error"} 0"#,
        r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"} 0"#,
        "ratelimit_service_config_load_success 1",
        "ratelimit_service_config_load_error 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    // sluice's own metrics stay where they were.
    let (_, _, own) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(own.contains("sluice_requests_total"));
    assert!(own
        .lines()
        .any(|l| l == "sluice_request_duration_seconds_count 3"));
    s.stop().await.unwrap();
}
