//! Tests of the per-rule metrics against hostile input, scraped as `/metrics` renders them:
//! keys made from client input bounded in bytes, client-made series bounded apart from the
//! operator's, every hit counted past the bound, removed rules' series dropped on reload, and
//! counters that saturate instead of wrapping.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::*;
use crate::core::clock::ManualClock;

/// The start of a minute.
const T0: UnixMillis = UnixMillis(1_700_006_400_000);

fn limiter(yaml: &str, opts: Options) -> Arc<RateLimiter> {
    RateLimiter::local(yaml, Arc::new(ManualClock::new(T0)), opts).unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, d: RateLimitDescriptor) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

/// A descriptor with a request-supplied limit: any client may send one for a known domain.
fn overriding(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 1_000,
            unit: 2, // MINUTE
        }),
        ..descriptor(entries)
    }
}

/// `(labels, value)` of every series of `metric` in the Prometheus text.
fn series(text: &str, metric: &str) -> Vec<(String, f64)> {
    let prefix = format!("{metric}{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|l| {
            let (labels, value) = l.rsplit_once("} ").expect("labels} value");
            (labels.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

fn hits(text: &str) -> Vec<(String, f64)> {
    series(text, "ratelimit_total_hits_total")
}

/// The hits of domain `d`'s series `rule` in `rows` (from [`hits`]), if it is there.
fn hits_of(rows: &[(String, f64)], rule: &str) -> Option<f64> {
    rows.iter()
        .find(|(k, _)| *k == format!("domain=\"d\",rule=\"{rule}\""))
        .map(|(_, v)| *v)
}

const DOMAIN: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: u\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";

#[test]
fn client_made_metric_keys_are_bounded_in_bytes() {
    let l = limiter(DOMAIN, Options::default());
    let long = "x".repeat(4_000);
    // Limit overrides of 32 entries of ~4 KB each (keys of ~128 KB), and detailed_metric
    // values of 4 KB: each a series of its own, as long as the client likes.
    for i in 0..20 {
        let values: Vec<(String, String)> = (0..32)
            .map(|j| (format!("e{j}"), format!("{i}{long}")))
            .collect();
        let entries: Vec<(&str, &str)> = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        l.should_rate_limit(&request("d", overriding(&entries)))
            .unwrap();
        let value = format!("{i}{long}");
        l.should_rate_limit(&request("d", descriptor(&[("u", &value)])))
            .unwrap();
    }
    let text = l.telemetry().render();
    let rows = hits(&text);
    // Distinct long keys stay distinct series, each with its own hit.
    let overrides = rows
        .iter()
        .filter(|(k, _)| k.contains("rule=\"d.e0_"))
        .count();
    let detailed = rows
        .iter()
        .filter(|(k, _)| k.contains("rule=\"d.u_"))
        .count();
    assert_eq!((overrides, detailed), (20, 20), "{rows:?}");
    assert!(rows.iter().all(|(_, v)| *v <= 1.0), "{rows:?}");
    // 40 client-made keys × 5 counters: a few hundred bytes each, not 128 KB.
    assert!(
        text.len() < 40 * 5 * 1_024,
        "/metrics is {} bytes for 40 client-made keys",
        text.len()
    );
    let stored: usize = l
        .telemetry()
        .rules
        .snapshot()
        .iter()
        .map(|((d, k), _)| d.len() + k.len())
        .sum();
    assert!(stored < 40 * 1_024, "{stored} bytes of stored keys");
}

#[test]
fn every_hit_is_counted_past_two_thousand_series() {
    let l = limiter(DOMAIN, Options::default());
    for i in 0..2_500 {
        l.should_rate_limit(&request("d", overriding(&[("e", &i.to_string())])))
            .unwrap();
    }
    let rows = hits(&l.telemetry().render());
    let total: f64 = rows.iter().map(|(_, v)| v).sum();
    assert_eq!(total, 2_500.0, "{} series", rows.len());
}

#[test]
fn every_operator_rule_has_its_series() {
    let mut yaml = String::from("domain: big\ndescriptors:\n");
    for i in 0..2_500 {
        yaml.push_str(&format!(
            "  - key: r{i}\n    rate_limit: {{unit: minute, requests_per_unit: 10}}\n"
        ));
    }
    let l = limiter(&yaml, Options::default());
    for i in 0..2_500 {
        l.should_rate_limit(&request("big", descriptor(&[(&format!("r{i}"), "v")])))
            .unwrap();
    }
    let rows = hits(&l.telemetry().render());
    for i in 0..2_500 {
        let labels = format!("domain=\"big\",rule=\"big.r{i}\"");
        assert!(
            rows.contains(&(labels.clone(), 1.0)),
            "{labels} missing from {} series",
            rows.len()
        );
    }
}

#[test]
fn a_reload_drops_the_series_of_removed_rules() {
    let rules = |prefix: &str| {
        let mut yaml = String::from("domain: d\ndescriptors:\n");
        for i in 0..50 {
            yaml.push_str(&format!(
                "  - key: {prefix}{i}\n    detailed_metric: true\n    rate_limit: {{unit: minute, requests_per_unit: 10}}\n"
            ));
        }
        crate::rules::compile_sources(&[("r.yaml".into(), yaml)], false).unwrap()
    };
    let l = limiter("domain: d\ndescriptors: []\n", Options::default());
    for round in 0..10 {
        let prefix = format!("g{round}_");
        l.swap_rules(rules(&prefix), vec![]);
        for i in 0..50 {
            // A detailed series of the rule too: client-made, but the rule's own.
            l.should_rate_limit(&request("d", descriptor(&[(&format!("{prefix}{i}"), "v")])))
                .unwrap();
        }
    }
    let rows = hits(&l.telemetry().render());
    assert!(
        rows.iter().all(|(k, _)| k.contains("rule=\"d.g9_")),
        "series of removed rules remain: {} series",
        rows.len()
    );
    // The rules in force: their own series and their detailed ones.
    assert_eq!(rows.len(), 100, "{rows:?}");
}

#[test]
fn metric_counters_saturate_instead_of_wrapping() {
    let l = limiter(DOMAIN, Options::default());
    for _ in 0..5 {
        l.should_rate_limit(&request("d", descriptor(&[("k", "v")])))
            .unwrap();
    }
    let mut huge = descriptor(&[("k", "v")]);
    huge.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: u64::MAX });
    l.should_rate_limit(&request("d", huge)).unwrap();
    let text = l.telemetry().render();
    let read = |metric: &str| {
        series(&text, metric)
            .into_iter()
            .find(|(k, _)| k == "domain=\"d\",rule=\"d.k\"")
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("{metric} in\n{text}"))
    };
    let total = read("ratelimit_total_hits_total");
    let over = read("ratelimit_over_limit_total");
    let within = read("ratelimit_within_limit_total");
    // Monotonic: Prometheus must not read a reset. Saturated at u64::MAX, as the
    // decision's own counts are.
    assert!(total >= 5.0, "total_hits went from 5 to {total}");
    assert_eq!(total, u64::MAX as f64);
    assert!(
        over + within <= total * (1.0 + 1e-9),
        "{over} + {within} > {total}"
    );
    assert_eq!(within, 5.0);
}

#[test]
fn past_the_client_series_bound_hits_go_to_the_rules_own_series() {
    let opts = Options {
        metric_series: crate::telemetry::SeriesBounds {
            max_key_bytes: 512,
            max_client_series: 100,
        },
        ..Options::default()
    };
    let l = limiter(DOMAIN, opts);
    for i in 0..300 {
        l.should_rate_limit(&request("d", overriding(&[("e", &i.to_string())])))
            .unwrap();
        l.should_rate_limit(&request("d", descriptor(&[("u", &i.to_string())])))
            .unwrap();
    }
    // The operator's rule is counted in its own series, whatever the flood.
    l.should_rate_limit(&request("d", descriptor(&[("k", "v")])))
        .unwrap();
    let rows = hits(&l.telemetry().render());
    let read = |rule: &str| hits_of(&rows, rule);
    assert_eq!(read("d.k"), Some(1.0));
    let client = rows
        .iter()
        .filter(|(k, _)| k.contains("rule=\"d.e_") || k.contains("rule=\"d.u_"))
        .count();
    assert_eq!(client, 100, "client-made series");
    // 600 client-made hits: 100 in series of their own, 500 in the fallbacks.
    let fallbacks = read("d.override").unwrap() + read("d.u").unwrap();
    assert_eq!(fallbacks, 500.0, "{rows:?}");
    let total: f64 = rows.iter().map(|(_, v)| v).sum();
    assert_eq!(total, 601.0);
}

#[test]
fn an_overrides_hits_count_in_its_own_series_or_with_metrics_override_series_off_the_rules() {
    let yaml = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n    overrides: {acme: 50}\n";
    for (own, acme, tenant) in [(true, Some(2.0), Some(1.0)), (false, None, Some(3.0))] {
        let opts = Options {
            override_series: own,
            ..Options::default()
        };
        let l = limiter(yaml, opts);
        for value in ["acme", "acme", "globex"] {
            l.should_rate_limit(&request("d", descriptor(&[("tenant", value)])))
                .unwrap();
        }
        let rows = hits(&l.telemetry().render());
        let read = |rule: &str| hits_of(&rows, rule);
        assert_eq!(
            (read("d.tenant_acme"), read("d.tenant")),
            (acme, tenant),
            "{rows:?}"
        );
    }
}

#[test]
fn label_values_are_escaped_once_and_rendered_alike() {
    let l = limiter(DOMAIN, Options::default());
    l.should_rate_limit(&request("d", descriptor(&[("u", "a\"b\\c\nd")])))
        .unwrap();
    let text = l.telemetry().render();
    let line = "ratelimit_total_hits_total{domain=\"d\",rule=\"d.u_a\\\"b\\\\c\\nd\"} 1";
    assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
}
