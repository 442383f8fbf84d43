//! The same server's HTTP port, on grpc.rs's rules: `POST /json` (camelCase and snake_case,
//! 429 over the limit, 400 for bad bodies), `/healthcheck`, `/livez`, `/readyz`, `/rlconfig`
//! and `/metrics`; and the build they name.

use crate::common::{header, http_async, Server};
use crate::grpc::RULES;

#[tokio::test]
async fn http_endpoints() {
    let s = Server::start(RULES, |_| {}).await;
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"j"}]}],"hitsAddend":"3"}"#;
    let (status, headers, json) = http_async(s.http, "POST", "/json", body).await.unwrap();
    assert_eq!(status, 200, "{json}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert!(
        v["statuses"][0].get("limitRemaining").is_none(),
        "0 is omitted, as protojson does: {json}"
    );
    assert_eq!(v["statuses"][0]["durationUntilReset"], "60s");
    // snake_case names work too; over the limit is a 429.
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"j"}],"hits_addend":5}]}"#;
    let (status, _, json) = http_async(s.http, "POST", "/json", body).await.unwrap();
    assert_eq!(status, 429, "{json}");
    assert!(json.contains(r#""overallCode":"OVER_LIMIT""#), "{json}");
    for (bad, want) in [
        ("{not json", "bad request"),
        (r#"{"domain":"","descriptors":[]}"#, "domain"),
        (r#"{"domain":"d","bogus":1}"#, "bogus"),
    ] {
        let (status, _, text) = http_async(s.http, "POST", "/json", bad).await.unwrap();
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains(want), "{bad}: {text}");
    }
    assert_eq!(
        http_async(s.http, "GET", "/healthcheck", "")
            .await
            .unwrap()
            .2,
        "OK"
    );
    assert_eq!(
        http_async(s.http, "GET", "/livez", "").await.unwrap().0,
        200
    );
    let (status, _, ready) = http_async(s.http, "GET", "/readyz", "").await.unwrap();
    assert_eq!(status, 200);
    assert!(ready.contains("rules: 11 from 1 file(s)"), "{ready}");
    let (_, _, rl) = http_async(s.http, "GET", "/rlconfig", "").await.unwrap();
    assert!(
        rl.contains("test.k: unit=MINUTE requests_per_unit=3, shadow_mode: false"),
        "{rl}"
    );
    assert_eq!(rl.lines().count(), 11, "{rl}");
    let (_, _, m) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    for line in [
        r#"ratelimit_total_hits_total{domain="test",rule="test.k"} 8"#,
        r#"ratelimit_over_limit_total{domain="test",rule="test.k"} 5"#,
        r#"ratelimit_within_limit_total{domain="test",rule="test.k"} 3"#,
        r#"ratelimit_near_limit_total{domain="test",rule="test.k"} 3"#,
        r#"sluice_config_load_total{result="success"} 1"#,
        r#"sluice_request_errors_total{reason="invalid_argument"} 1"#,
    ] {
        assert!(m.contains(line), "missing {line} in\n{m}");
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn the_build_is_named_in_metrics_and_the_rules_status() {
    // The commit `build.rs` read: this checkout's, as CI's fresh clone has its `.git`.
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert_eq!(
        sluice::COMMIT,
        commit,
        "built from another commit than HEAD?"
    );
    let s = Server::start(RULES, |_| {}).await;
    let (_, _, m) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    let info = format!(
        r#"sluice_build_info{{commit="{commit}",version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(m.contains(&info), "missing {info} in\n{m}");
    let (_, _, status) = http_async(s.http, "GET", "/rlconfig/status", "")
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{status}");
    assert_eq!(v["commit"], commit, "{status}");
    s.stop().await.unwrap();
}
