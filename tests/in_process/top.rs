//! Who is near a limit (`GET /top`) and the per-rule utilization gauges: a Zipf load through
//! the real limiter ranks as the truth does; `/top` needs the admin token (401 without, one
//! configured or not, unless `ADMIN_OPEN_READS`), refuses `n` past 1,000; `/metrics` serves
//! each rule's limit, tracked, near and over keys.

use std::collections::HashMap;
use std::sync::Arc;

use sluice::core::clock::{ManualClock, UnixMillis};
use sluice::rls::{Options, RateLimiter, TopQuery};
use sluice::server::admin_token::AdminToken;

use crate::common::{desc, header, http, Server};

/// Two rules of different limits, so that the ranking is by count ÷ limit, not by count.
const ZIPF_RULES: &str = "domain: z
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100000, algorithm: fixed_window}
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 40000, algorithm: fixed_window}
";

/// splitmix64: a seeded, reproducible stream.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The cumulative weights of a Zipf law of exponent `s` over `n` ranks.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

#[test]
fn top_ten_of_a_zipf_load_is_the_true_top_ten_by_count_over_limit() {
    const KEYS: usize = 10_000;
    const HITS: usize = 200_000;
    let clock = ManualClock::new(UnixMillis(
        1_700_000_000_000 - 1_700_000_000_000 % 3_600_000,
    ));
    let limiter =
        RateLimiter::local(ZIPF_RULES, Arc::new(clock.clone()), Options::default()).expect("rules");
    let cdf = zipf_cdf(KEYS, 1.1);
    // The truth: every (rule key, value)'s count. Each rule's values rank in their own
    // shuffled order, so that the two rules' heavy keys differ.
    let mut truth: HashMap<(&str, u64), u64> = HashMap::new();
    let mut rng = 7u64;
    for i in 0..HITS {
        let u = (next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
        let rank = cdf.partition_point(|&c| c < u).min(KEYS - 1) as u64;
        let (key, value) = if i % 2 == 0 {
            ("user", rank.wrapping_mul(7919) % KEYS as u64)
        } else {
            ("org", rank.wrapping_mul(104_729) % KEYS as u64)
        };
        *truth.entry((key, value)).or_default() += 1;
        let req = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
            domain: "z".into(),
            descriptors: vec![desc(&[(key, &value.to_string())])],
            hits_addend: 1,
        };
        let resp = limiter.should_rate_limit(&req).expect("a valid request");
        assert_eq!(resp.overall_code, 1, "every hit is within these limits");
        // Time moves within the hour: the counts stay those of one window.
        if i % 1000 == 0 {
            clock.advance_ms(10);
        }
    }
    let limit = |key: &str| if key == "user" { 100_000.0 } else { 40_000.0 };
    let mut want: Vec<f64> = truth
        .iter()
        .map(|((k, _), &c)| c as f64 / limit(k))
        .collect();
    want.sort_by(|a, b| b.total_cmp(a));
    let top = limiter.top(TopQuery {
        domain: None,
        rule: None,
        n: 10,
    });
    assert_eq!(top.keys.len(), 10);
    let got: Vec<f64> = top.keys.iter().map(|k| k.ratio).collect();
    // Ties (equal counts of one rule) may list either key: the ratios are what must match,
    // and each key listed must be reported at its true count.
    assert_eq!(got, want[..10].to_vec(), "{:?}", top.keys);
    for k in &top.keys {
        let e = &k.entries[0];
        let value: u64 = e.value.parse().unwrap();
        let key = if e.key == "user" { "user" } else { "org" };
        assert_eq!(k.rule, format!("z.{key}"));
        assert_eq!(k.count, truth[&(key, value)], "{k:?}");
        assert_eq!(f64::from(k.limit), limit(key));
        assert_eq!(k.unit, "hour");
        assert!(k.reset_seconds > 0 && k.reset_seconds <= 3600);
    }
    // A filter by rule lists that rule's keys only, in its own order.
    let org = limiter.top(TopQuery {
        domain: Some("z"),
        rule: Some("z.org"),
        n: 1000,
    });
    assert!(org.keys.iter().all(|k| k.rule == "z.org"));
    assert!(org.keys.windows(2).all(|w| w[0].ratio >= w[1].ratio));
    assert_eq!(
        org.keys.len(),
        1000,
        "as many as asked, of 10,000 keys seen"
    );
}

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4}\n";

async fn get(s: &Server, path: &str, auth: &str) -> (u16, Vec<(String, String)>, String) {
    let (addr, path, auth) = (s.http, path.to_string(), auth.to_string());
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = if auth.is_empty() {
            Vec::new()
        } else {
            vec![("Authorization", auth.as_str())]
        };
        http(addr, "GET", &path, "", &headers).unwrap()
    })
    .await
    .unwrap()
}

/// `hits` of `d`'s `k` = `value` over `/json`.
async fn hit(s: &Server, value: &str, hits: usize) {
    let addr = s.http;
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}]}}]}}"#
    );
    tokio::task::spawn_blocking(move || {
        for _ in 0..hits {
            http(addr, "POST", "/json", &body, &[]).unwrap();
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn top_needs_the_token_and_bounds_n() {
    let s = Server::start(RULES, |st| st.admin_token = AdminToken::new("s3cret")).await;
    hit(&s, "alice", 3).await;
    hit(&s, "bob", 1).await;
    for auth in ["", "Bearer wrong", "Basic s3cret"] {
        let (status, headers, text) = get(&s, "/top", auth).await;
        assert_eq!(status, 401, "{auth}: {text}");
        assert!(
            header(&headers, "www-authenticate").is_some_and(|v| v.starts_with("Bearer")),
            "{headers:?}"
        );
        assert!(!text.contains("alice"), "{text}");
    }
    let (status, _, text) = get(&s, "/top?domain=d&n=1&unknown=1", "Bearer s3cret").await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{text}");
    let k = &keys[0];
    assert_eq!(k["domain"], "d");
    assert_eq!(k["rule"], "d.k");
    assert_eq!(k["name"], "");
    assert_eq!(k["entries"][0]["key"], "k");
    assert_eq!(k["entries"][0]["value"], "alice");
    assert_eq!(
        (k["count"].as_u64(), k["limit"].as_u64()),
        (Some(3), Some(4))
    );
    assert_eq!(k["unit"], "hour");
    assert_eq!(k["ratio"], 0.75);
    assert!(k["reset_seconds"].as_u64().is_some_and(|r| r <= 3600));
    let (_, _, all) = get(&s, "/top", "Bearer s3cret").await;
    assert!(all.contains("alice") && all.contains("bob"), "{all}");
    let (_, _, other) = get(&s, "/top?domain=other", "Bearer s3cret").await;
    assert_eq!(other.trim(), r#"{"keys":[]}"#);
    for n in ["0", "1001", "x", "-3"] {
        let (status, _, text) = get(&s, &format!("/top?n={n}"), "Bearer s3cret").await;
        assert_eq!(status, 400, "n={n}: {text}");
        assert!(text.contains("from 1 to 1000"), "{text}");
    }
    let long = format!("/top?domain={}", "x".repeat(9000));
    assert_eq!(get(&s, &long, "Bearer s3cret").await.0, 400);
    assert_eq!(get(&s, "/top?n=1000", "Bearer s3cret").await.0, 200);
}

#[tokio::test]
async fn top_without_a_token_configured_is_refused_unless_reads_are_open() {
    let s = Server::start(RULES, |_| {}).await;
    hit(&s, "alice", 1).await;
    let (status, _, text) = get(&s, "/top", "Bearer anything").await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("ADMIN_TOKEN_FILE"), "{text}");
    let open = Server::start(RULES, |st| st.admin_open_reads = true).await;
    hit(&open, "alice", 1).await;
    let (status, _, text) = get(&open, "/top", "").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("alice"), "{text}");
    // Open reads open nothing else: /reset still needs a token.
    let addr = open.http;
    let reset = tokio::task::spawn_blocking(move || {
        http(
            addr,
            "POST",
            "/reset",
            r#"{"domain":"d","descriptors":[]}"#,
            &[],
        )
        .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(reset.0, 401, "{}", reset.2);
}

/// The value of the series `name{labels}` on `/metrics`.
fn series(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (l, v) = rest.split_once("} ")?;
        (labels
            .split(',')
            .all(|want| l.split(',').any(|have| have == want)))
        .then(|| v.trim().parse().ok())?
    })
}

#[tokio::test]
async fn metrics_serve_each_rules_limit_and_its_keys_near_and_over() {
    let s = Server::start(RULES, |_| {}).await;
    hit(&s, "alice", 5).await; // 4 admitted, the fifth over
    hit(&s, "bob", 4).await; // at the limit: near, not over
    hit(&s, "carol", 1).await;
    let (status, _, m) = get(&s, "/metrics", "").await;
    assert_eq!(status, 200);
    let labels = r#"domain="d",rule="d.k""#;
    let read = |name: &str| series(&m, name, labels).unwrap_or_else(|| panic!("{name}:\n{m}"));
    assert_eq!(read("sluice_rule_limit"), 4.0);
    assert_eq!(read("sluice_rule_unit_seconds"), 3600.0);
    assert_eq!(read("sluice_rule_tracked_keys"), 3.0);
    assert_eq!(read("sluice_rule_near_limit_keys"), 2.0, "alice and bob");
    assert_eq!(read("sluice_rule_over_limit_keys"), 1.0, "alice");
    // The next window: nothing near or over yet (the keys may be swept by now).
    s.clock.advance_ms(3_600_000);
    let (_, _, m) = get(&s, "/metrics", "").await;
    let read = |name: &str| series(&m, name, labels).unwrap_or_else(|| panic!("{name}:\n{m}"));
    assert_eq!(read("sluice_rule_near_limit_keys"), 0.0);
    assert_eq!(read("sluice_rule_over_limit_keys"), 0.0);
}

#[test]
fn every_rule_has_its_gauges_past_the_sdks_default_cardinality() {
    // 2,500 rules: past the OpenTelemetry SDK's default of 2,000 series an instrument, which
    // would fold the rest into one overflow series.
    let mut yaml = String::from("domain: many\ndescriptors:\n");
    for i in 0..2500 {
        yaml.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}}}\n",
            i + 1
        ));
    }
    let clock = ManualClock::new(UnixMillis(1_700_000_000_000));
    let limiter = RateLimiter::local(&yaml, Arc::new(clock), Options::default()).expect("rules");
    let text = limiter.telemetry().render();
    let limits: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_rule_limit{"))
        .collect();
    assert_eq!(limits.len(), 2500, "{:?}", limits.last());
    assert!(limits.iter().all(|l| !l.contains("overflow")));
    assert!(text.contains(r#"sluice_rule_limit{domain="many",rule="many.k2499"} 2500"#));
}

/// `d`'s `k` with an override for `acme` (5 an hour).
const WITH_OVERRIDE: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4}\n    overrides: {acme: 5}\n";

/// `hits` of `d`'s `k` = `value` with a limit the request supplies (`per_hour` an hour): the
/// last answer.
async fn hit_with_limit(s: &Server, value: &str, per_hour: u32, hits: usize) -> String {
    let addr = s.http;
    let body = format!(
        r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}],"limit":{{"requestsPerUnit":{per_hour},"unit":"HOUR"}}}}]}}"#
    );
    tokio::task::spawn_blocking(move || {
        let mut last = String::new();
        for _ in 0..hits {
            let (status, _, text) = http(addr, "POST", "/json", &body, &[]).unwrap();
            assert!(status == 200 || status == 429, "{text}");
            last = text;
        }
        last
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn top_and_the_rule_gauges_list_keys_of_overrides_but_not_of_limits_requests_supply() {
    let s = Server::start(WITH_OVERRIDE, |st| {
        st.admin_token = AdminToken::new("s3cret")
    })
    .await;
    hit(&s, "acme", 5).await; // the override's 5 of 5
    hit(&s, "bob", 3).await; // the rule's 3 of 4
                             // The request's limit, 2, counted: the third is over.
    let third = hit_with_limit(&s, "carol", 2, 3).await;
    assert!(third.contains("OVER_LIMIT"), "{third}");
    let (status, _, text) = get(&s, "/top", "Bearer s3cret").await;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let listed: Vec<(String, String)> = (v["keys"].as_array().unwrap().iter())
        .map(|k| {
            let value = k["entries"][0]["value"].as_str().unwrap().to_string();
            (value, k["rule"].as_str().unwrap().to_string())
        })
        .collect();
    // An override of the rules files is a rule of its own (`d.k_acme`), listed as any; a
    // limit the request supplies has no rule to list it under (docs/operations.md).
    assert_eq!(
        listed,
        [
            ("acme".to_string(), "d.k_acme".to_string()),
            ("bob".to_string(), "d.k".to_string())
        ],
        "{text}"
    );
    let (_, _, m) = get(&s, "/metrics", "").await;
    let tracked = |rule: &str| {
        series(
            &m,
            "sluice_rule_tracked_keys",
            &format!(r#"domain="d",rule="{rule}""#),
        )
    };
    assert_eq!(
        (tracked("d.k"), tracked("d.k_acme")),
        (Some(1.0), Some(1.0))
    );
    assert_eq!(
        series(&m, "sluice_rule_near_limit_keys", r#"rule="d.k_acme""#),
        Some(1.0)
    );
    assert!(
        !m.lines()
            .any(|l| l.starts_with("sluice_rule_") && l.contains("override")),
        "{m}"
    );
}
