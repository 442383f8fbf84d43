//! `POST /explain`: the rule a descriptor matched with its file and line (or its xDS
//! resource), an override, why none matched, shadow mode, the overall code, the request
//! bounds, and that explaining counts nothing and creates no entity (the next real `/json`
//! hit sees the count unchanged).

use serde_json::Value;

use crate::common::{http_async, Server};

const RULES: &str = "\
domain: ex
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
    overrides:
      big: 50
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 10}
";

/// A body of one descriptor per `key=value` list.
fn body(descriptors: &[&[(&str, &str)]]) -> String {
    let ds: Vec<Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({"domain": "ex", "descriptors": ds}).to_string()
}

async fn explain(s: &Server, descriptors: &[&[(&str, &str)]]) -> Value {
    let (status, _, text) = http_async(s.http, "POST", "/explain", &body(descriptors))
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

async fn hit(s: &Server, descriptors: &[&[(&str, &str)]]) -> Value {
    let (_, _, text) = http_async(s.http, "POST", "/json", &body(descriptors))
        .await
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

async fn entities(s: &Server) -> String {
    let (_, _, m) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    m.lines()
        .find(|l| l.starts_with("sluice_entities "))
        .unwrap_or_else(|| panic!("no sluice_entities in\n{m}"))
        .to_string()
}

#[tokio::test]
async fn a_matched_rule_names_its_file_line_and_limits() {
    let s = Server::start(RULES, |_| {}).await;
    let v = explain(&s, &[&[("user", "alice")]]).await;
    let d = &v["descriptors"][0];
    assert_eq!(d["rule"]["full_key"], "ex.user", "{v}");
    assert_eq!(d["rule"]["name"], "per_user");
    let file = d["rule"]["source"]["file"].as_str().unwrap();
    assert!(file.ends_with("rules.yaml"), "{v}");
    assert_eq!(d["rule"]["source"]["line"], 3, "{v}");
    let l = &d["limits"][0];
    assert_eq!(
        (&l["algorithm"], &l["requests_per_unit"], &l["unit"]),
        (&"sliding_window".into(), &3.into(), &"MINUTE".into())
    );
    assert_eq!((&l["count"], &l["remaining"]), (&0.into(), &3.into()));
    assert_eq!(l["decision"], "OK");
    assert_eq!(
        (&v["overall_code"], &v["charged"]),
        (&"OK".into(), &false.into())
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn an_override_names_its_rule_and_its_own_limit_and_line() {
    let s = Server::start(RULES, |_| {}).await;
    let v = explain(&s, &[&[("tenant", "big")], &[("tenant", "small")]]).await;
    let big = &v["descriptors"][0];
    assert_eq!(big["rule"]["full_key"], "ex.tenant_big", "{v}");
    assert_eq!(big["rule"]["override_of"], "ex.tenant");
    assert_eq!(big["rule"]["source"]["line"], 8, "{v}");
    assert_eq!(big["limits"][0]["requests_per_unit"], 50);
    let small = &v["descriptors"][1];
    assert_eq!(small["rule"]["full_key"], "ex.tenant");
    assert!(small["rule"].get("override_of").is_none(), "{v}");
    assert_eq!(small["limits"][0]["requests_per_unit"], 5);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_descriptor_without_a_rule_says_which_entry_stopped_the_walk() {
    let s = Server::start(RULES, |_| {}).await;
    let v = explain(
        &s,
        &[
            &[("nokey", "1")],
            &[("path", "/other"), ("method", "GET")],
            &[("path", "/api"), ("verb", "GET")],
            &[("path", "/api")],
            &[("path", "/api"), ("method", "GET")],
        ],
    )
    .await;
    let miss = |i: usize| v["descriptors"][i]["no_match"].clone();
    assert_eq!(miss(0)["reason"], "no_key", "{v}");
    assert_eq!(
        (&miss(0)["level"], &miss(0)["key"]),
        (&1.into(), &"nokey".into())
    );
    assert_eq!(miss(1)["reason"], "no_value", "{v}");
    assert_eq!(
        (&miss(1)["level"], &miss(1)["value"]),
        (&1.into(), &"/other".into())
    );
    assert_eq!(miss(2)["reason"], "no_key", "{v}");
    assert_eq!(
        (&miss(2)["level"], &miss(2)["key"]),
        (&2.into(), &"verb".into())
    );
    assert_eq!(miss(3)["reason"], "no_limit", "{v}");
    assert!(v["descriptors"][0].get("rule").is_none());
    assert_eq!(
        v["descriptors"][4]["rule"]["full_key"],
        "ex.path_/api.method"
    );
    assert_eq!(v["descriptors"][4]["rule"]["source"]["line"], 15, "{v}");
    // An unknown domain is a reason too.
    let other = r#"{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;
    let (_, _, text) = http_async(s.http, "POST", "/explain", other).await.unwrap();
    assert!(text.contains(r#""reason":"unknown_domain""#), "{text}");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn explaining_counts_nothing_and_creates_no_entity() {
    let s = Server::start(RULES, |_| {}).await;
    hit(&s, &[&[("user", "bob")]]).await;
    hit(&s, &[&[("user", "bob")]]).await;
    let before = entities(&s).await;
    for _ in 0..5 {
        let v = explain(&s, &[&[("user", "bob")], &[("user", "carol")]]).await;
        let bob = &v["descriptors"][0]["limits"][0];
        assert_eq!(
            (&bob["count"], &bob["remaining"]),
            (&2.into(), &1.into()),
            "{v}"
        );
        assert_eq!(bob["decision"], "OK");
        let carol = &v["descriptors"][1]["limits"][0];
        assert_eq!(carol["count"], 0, "{v}");
    }
    assert_eq!(entities(&s).await, before, "carol's entity was not created");
    // The third real hit is the third counted: within the limit, none left.
    let r = hit(&s, &[&[("user", "bob")]]).await;
    assert_eq!(r["overallCode"], "OK", "{r}");
    assert!(
        r["statuses"][0].get("limitRemaining").is_none(),
        "0 left: {r}"
    );
    // Now at the limit: the next hit would go over, and explain says so without counting it.
    for _ in 0..2 {
        let v = explain(&s, &[&[("user", "bob")]]).await;
        let d = &v["descriptors"][0];
        assert_eq!(
            (&d["limits"][0]["count"], &d["decision"]),
            (&3.into(), &"OVER_LIMIT".into())
        );
        assert_eq!(
            (&d["code"], &v["overall_code"]),
            (&"OVER_LIMIT".into(), &"OVER_LIMIT".into())
        );
    }
    let (_, _, m) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        m.contains(r#"ratelimit_total_hits_total{domain="ex",rule="ex.user"} 3"#),
        "explanations are not hits:\n{m}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn shadow_mode_turns_an_over_decision_to_ok() {
    let s = Server::start(RULES, |_| {}).await;
    hit(&s, &[&[("shadow", "x")]]).await;
    let v = explain(&s, &[&[("shadow", "x")]]).await;
    let d = &v["descriptors"][0];
    assert_eq!(d["rule"]["shadow_mode"], true, "{v}");
    assert_eq!(
        (&d["decision"], &d["code"]),
        (&"OVER_LIMIT".into(), &"OK".into())
    );
    assert_eq!(v["overall_code"], "OK");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_bad_body_is_refused_as_json_refuses_it() {
    let s = Server::start(RULES, |st| st.options.max_descriptors = 2).await;
    for (bad, want) in [
        ("{not json", "bad request"),
        (r#"{"domain":"","descriptors":[{"entries":[]}]}"#, "domain"),
    ] {
        let (status, _, text) = http_async(s.http, "POST", "/explain", bad).await.unwrap();
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains(want), "{bad}: {text}");
    }
    let three = body(&[&[("user", "a")], &[("user", "b")], &[("user", "c")]]);
    let (status, _, text) = http_async(s.http, "POST", "/explain", &three)
        .await
        .unwrap();
    assert_eq!(
        (status, text.trim_end()),
        (400, "too many descriptors: 3 (at most 2)")
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_rule_pushed_over_xds_names_its_resource() {
    use crate::common::xds::{config, AdsServer};
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit::Minute;
    let ads = AdsServer::start(None).await;
    ads.set("v1", &[config("x", &[("k", Minute, 2)])]);
    let addr = ads.addr;
    let s = Server::start("", |st| st.xds = Some(crate::xds::xds_settings(addr))).await;
    let body = r#"{"domain":"x","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, _, text) = http_async(s.http, "POST", "/explain", body).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let rule = &v["descriptors"][0]["rule"];
    assert_eq!(rule["full_key"], "x.k", "{v}");
    assert_eq!(rule["source"], serde_json::json!({"xds": "x"}), "{v}");
    s.stop().await.unwrap();
}
