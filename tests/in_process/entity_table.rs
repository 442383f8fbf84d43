//! The entity table as a user meets it over gRPC (docs/rules.md, "Decisions"): with
//! `CACHE_MAX_ENTRIES=1000`, a value over its limit stays over after 5,000 other values pass
//! through (before, it was admitted again: an attacker flooding distinct values reset a
//! victim's limit), values never seen are still admitted, and the metrics say what was evicted.

use crate::common::{desc, http_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const RULES: &str = r#"
domain: edge
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket, burst: 5}
"#;

fn req(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![desc(&[(key, value)])],
        hits_addend: 0,
    }
}

/// The first counter or gauge line of `name` with `label` in the metrics text, as a number.
fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} {label} in the metrics"))
}

#[tokio::test]
async fn a_victim_stays_over_its_limit_while_a_flood_of_values_passes_through_a_full_table() {
    let s = Server::start(RULES, |st| st.options.cache.max_entries = 1000).await;
    let mut c = s.client().await;
    for (key, n) in [("ip", 10), ("user", 5)] {
        for i in 0..n {
            let r = c.should_rate_limit(req(key, "victim")).await.unwrap();
            assert_eq!(r.get_ref().overall_code, Code::Ok as i32, "{key} hit {i}");
        }
        let r = c.should_rate_limit(req(key, "victim")).await.unwrap();
        assert_eq!(r.get_ref().overall_code, Code::OverLimit as i32, "{key}");
    }
    // 5,000 distinct values, once each, a millisecond apart (the clock is the test's).
    for i in 0..5000 {
        s.clock.advance_ms(1);
        let key = if i % 2 == 0 { "ip" } else { "user" };
        let r = c
            .should_rate_limit(req(key, &format!("flood-{i}")))
            .await
            .unwrap();
        assert_eq!(r.get_ref().overall_code, Code::Ok as i32, "flood value {i}");
    }
    let (_, _, text) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    // 5,002 values in a table of 1,000: 4,002 evicted, all still counting (the order of
    // eviction, what holds nothing first, is `core/table_tests.rs`'s).
    let evicted = |kind: &str| {
        metric(
            &text,
            "sluice_entity_evictions_total",
            &format!("kind=\"{kind}\""),
        )
    };
    assert_eq!(evicted("live"), 4002.0);
    assert_eq!(metric(&text, "sluice_entities", ""), 1000.0);
    // The victim was evicted, and is still over on both limits.
    for key in ["ip", "user"] {
        let r = c.should_rate_limit(req(key, "victim")).await.unwrap();
        assert_eq!(r.get_ref().overall_code, Code::OverLimit as i32, "{key}");
    }
    // Values never seen are admitted.
    for i in 0..100 {
        for key in ["ip", "user"] {
            let r = c
                .should_rate_limit(req(key, &format!("new-{i}")))
                .await
                .unwrap();
            assert_eq!(r.get_ref().overall_code, Code::Ok as i32, "{key} new-{i}");
        }
    }
    let (_, _, text) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(metric(&text, "sluice_entity_restored_total", "") >= 2.0);
    assert_eq!(metric(&text, "sluice_entity_table_capacity", ""), 1000.0);
    s.stop().await.unwrap();
}
