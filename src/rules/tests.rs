//! Tests of the compiled rule set: matching, counter identity, overrides and `/rlconfig`.

use super::*;
use crate::rules::model::parse;
use std::collections::HashMap;

pub(super) fn set(yaml: &str) -> RuleSet {
    RuleSet::compile(&[("t.yaml".into(), parse("t.yaml", yaml).unwrap())], false).unwrap()
}

#[test]
fn rlconfig_shows_a_bucket_and_strict_only_when_not_its_default() {
    let s = set("domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 30}\n    additional_limits:\n      - {unit: minute, requests_per_unit: 5, algorithm: token_bucket, strict: true}\n      - {unit: hour, requests_per_unit: 100}\n");
    assert!(
        s.dump().contains(
            "d.u: unit=SECOND requests_per_unit=10 algorithm=token_bucket burst=30, \
         unit=MINUTE requests_per_unit=5 algorithm=token_bucket burst=5 strict=true, \
         unit=HOUR requests_per_unit=100, shadow_mode"
        ),
        "{}",
        s.dump()
    );
}

#[test]
fn rlconfig_shows_a_concurrency_limit_and_its_lease() {
    let s = set("domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 4, algorithm: concurrency}\n");
    assert!(
        s.dump().contains(
            "d.t: unit=MINUTE requests_per_unit=4 unit_multiplier=10 algorithm=concurrency, shadow_mode"
        ),
        "{}",
        s.dump()
    );
}

#[test]
fn distinct_values_get_distinct_counters_unless_shared() {
    let s = set("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: path\n    value: /api/*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    let a = s.find("d", &[("ip", "1.1.1.1")]).unwrap().entity;
    let b = s.find("d", &[("ip", "2.2.2.2")]).unwrap().entity;
    assert_ne!(a, b);
    let x = s.find("d", &[("path", "/api/x")]).unwrap().entity;
    let y = s.find("d", &[("path", "/api/y")]).unwrap().entity;
    assert_eq!(x, y);
}

#[test]
fn a_thousand_exact_and_wildcard_rules_each_match_their_own() {
    let mut y = String::from("domain: d\ndescriptors:\n");
    let limit = "    rate_limit: {unit: second, requests_per_unit: 1}\n";
    for i in 0..1000 {
        y += &format!("  - key: user\n    value: v{i}\n{limit}");
    }
    // Descending, so a value's own pattern comes before its shorter prefixes.
    for i in (0..1000).rev() {
        y += &format!("  - key: user\n    value: \"w{i}*\"\n{limit}");
    }
    y += &format!("  - key: user\n    value: \"*\"\n{limit}  - key: user\n{limit}");
    let s = set(&y);
    let key = |v: &str| {
        s.find("d", &[("user", v)])
            .map(|m| m.rule.full_key.as_str())
    };
    for i in [0, 1, 9, 10, 99, 500, 999] {
        assert_eq!(key(&format!("v{i}")), Some(format!("d.user_v{i}").as_str()));
        assert_eq!(
            key(&format!("w{i}")),
            Some(format!("d.user_w{i}*").as_str())
        );
        assert_eq!(
            key(&format!("w{i}x")),
            Some(format!("d.user_w{i}*").as_str())
        );
    }
    // v1000 has no exact rule: the first wildcard that matches is the catch-all.
    assert_eq!(key("v1000"), Some("d.user_*"));
    assert_eq!(key("w1000"), Some("d.user_w100*"));
    assert_eq!(key(""), Some("d.user_*"));
}

#[test]
fn ten_thousand_host_wildcards_cost_a_few_passes_over_each_value() {
    // The shape: 10,000 host-style patterns, a request of 64 descriptors with
    // 4 KB values. Every pattern has the same (empty) literal prefix, so a prefix index
    // cannot tell them apart.
    let mut y = String::from("domain: d\ndescriptors:\n");
    for i in 0..10_000 {
        y += &format!(
            "  - key: host\n    value: \"*.t{i}.example.com\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
    }
    let s = set(&y);
    let value = |i: usize, tail: &str| {
        let mut v = format!("{i}-").repeat(4096);
        v.truncate(4096 - tail.len());
        v + tail
    };
    tree::work::take();
    for i in 0..64 {
        // Values that match the last pattern, a middle one, or none at all.
        let (v, want) = match i % 3 {
            0 => (
                value(i, ".t9999.example.com"),
                Some("d.host_*.t9999.example.com"),
            ),
            1 => (value(i, &format!(".t{}.example.com", i * 100)), None),
            _ => (value(i, ".t10000.example.org"), None),
        };
        assert_eq!(v.len(), 4096);
        let got = s
            .find("d", &[("host", v.as_str())])
            .map(|m| m.rule.full_key.clone());
        match want {
            Some(w) => assert_eq!(got.as_deref(), Some(w)),
            None if i % 3 == 1 => {
                assert_eq!(got, Some(format!("d.host_*.t{}.example.com", i * 100)))
            }
            None => assert_eq!(got, None),
        }
        // A few passes over the value, whatever the number of patterns (today: one
        // pass per pattern, 10,000 of them).
        let work = tree::work::take();
        assert!(work <= 4 * 4096, "descriptor {i}: {work} bytes examined");
    }
}

#[test]
fn an_override_matches_and_counts_as_a_descriptor_for_its_value() {
    // An earlier wildcard that takes `acme-1` from the key-only rule, a level below the
    // key-only rule, metrics by value, a shared wildcard.
    let limit = "rate_limit: {unit: second, requests_per_unit: 1}";
    let over = "rate_limit: {unit: second, requests_per_unit: 5}";
    let rules = |t: &str, p: &str, more: &str| {
        set(&format!(
            "domain: d\ndescriptors:\n  - key: t\n    value: \"acme*\"\n    {limit}\n  \
             - key: t\n    value_to_metric: true\n    {limit}\n{t}    descriptors:\n      - key: m\n        {limit}\n  \
             - key: p\n    value: \"/api/*\"\n    share_threshold: true\n    detailed_metric: true\n    {limit}\n{p}{more}"
        ))
    };
    let plain = rules("", "", "");
    let with = rules(
        "    overrides: {acme-1: 5, beta: 5}\n",
        "    overrides: {/api/v1: 5}\n",
        "",
    );
    let expanded = rules(
        "",
        "",
        &format!(
            "  - key: t\n    value: acme-1\n    value_to_metric: true\n    {over}\n  \
         - key: t\n    value: beta\n    value_to_metric: true\n    {over}\n  \
         - key: p\n    value: /api/v1\n    detailed_metric: true\n    {over}\n"
        ),
    );
    let descriptors: &[&[(&str, &str)]] = &[
        &[("t", "acme-1")],
        &[("t", "acme-2")],
        &[("t", "beta")],
        &[("t", "gamma")],
        &[("p", "/api/v1")],
        &[("p", "/api/v2")],
    ];
    // The same rules but for knowing whose override each is.
    let unowned = |r: &Rule| Rule {
        override_of: None,
        ..r.clone()
    };
    for &d in descriptors {
        let (a, b) = (with.find("d", d).unwrap(), expanded.find("d", d).unwrap());
        assert_eq!(
            (unowned(a.rule), a.entity),
            (b.rule.clone(), b.entity),
            "{d:?}"
        );
        let bucket: HashMap<&str, &str> = d.iter().copied().collect();
        let c = with.find_bucket("d", &bucket).unwrap();
        assert_eq!(
            (unowned(c.rule), c.entity),
            (b.rule.clone(), b.entity),
            "{d:?}"
        );
        assert_eq!(with.metric_key(&a, d), expanded.metric_key(&b, d), "{d:?}");
    }
    let acme = [("t", "acme-1")];
    let m = with.find("d", &acme).unwrap();
    assert_eq!(m.rule.limits[0].limit.requests_per_unit, 5);
    assert_eq!(with.metric_key(&m, &acme).as_deref(), Some("d.t_acme-1"));
    // An override is its value's own counter, even under a shared wildcard.
    let shared = |s: &RuleSet, v| s.find("d", &[("p", v)]).unwrap().entity;
    assert_ne!(shared(&with, "/api/v1"), shared(&with, "/api/v2"));
    assert_eq!(shared(&with, "/api/v2"), shared(&plain, "/api/v3"));
    // Below an overridden value, the rule's own levels apply, as without the override.
    let nested = [("t", "beta"), ("m", "GET")];
    let (a, b) = (
        with.find("d", &nested).unwrap(),
        plain.find("d", &nested).unwrap(),
    );
    assert_eq!((a.rule, a.entity), (b.rule, b.entity));
    assert_eq!(a.rule.full_key, "d.t.m");
}

#[test]
fn rule_ids_survive_recompiling_and_change_with_the_limit() {
    let y = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let a = set(y).rules()[0].id;
    assert_eq!(a, set(y).rules()[0].id);
    assert_ne!(a, set(&y.replace("1}", "2}")).rules()[0].id);
}
