//! The chart's Grafana dashboard (`helm/sluice/dashboards/sluice.json`) asks only for
//! metrics sluice serves: every metric name in its queries appears in a running server's
//! `/metrics`, so a renamed metric cannot leave a panel silently empty, and the utilization
//! panels' per-rule gauges are served with the rule's labels. The server runs in
//! global mode on a real redis-server, so the sync panels' metrics are there too.

use crate::common::redis::{global_mode, RedisServer};
use crate::common::{desc, http_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The metric names in a PromQL expression: identifiers of sluice's two families.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &expr[i..];
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if boundary && (rest.starts_with("sluice_") || rest.starts_with("ratelimit_")) {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            names.push(rest[..len].to_string());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_served() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/helm/sluice/dashboards/sluice.json"
    );
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a PromQL expr").to_string())
        .collect();
    assert!(exprs.len() >= 20, "{} queries", exprs.len());

    let rules = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let redis = RedisServer::start();
    let s = Server::start(rules, global_mode(vec![redis.url()], false, 2)).await;
    let mut c = s.client().await;
    for _ in 0..2 {
        c.should_rate_limit(RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![desc(&[("k", "v")])],
            hits_addend: 0,
        })
        .await
        .unwrap();
    }
    let (_, _, text) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    let served: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no sluice metric in {expr}");
        for name in names {
            assert!(
                served.contains(&name.as_str()),
                "{name} (in {expr}) is not served"
            );
        }
    }
    // The utilization panels: each rule's gauges, labelled by its domain and path.
    for name in [
        "sluice_rule_limit",
        "sluice_rule_unit_seconds",
        "sluice_rule_tracked_keys",
        "sluice_rule_near_limit_keys",
        "sluice_rule_over_limit_keys",
    ] {
        assert!(
            exprs
                .iter()
                .any(|e| metric_names(e).iter().any(|n| n == name)),
            "no panel queries {name}"
        );
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name}{{"))
                && l.contains(r#"domain="d""#)
                && l.contains(r#"rule="d.k""#)),
            "{name} is not served for the rule d.k:\n{text}"
        );
    }
    s.stop().await.unwrap();
}
