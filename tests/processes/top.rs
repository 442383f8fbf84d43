//! `GET /top` and the per-rule gauges against a `sluice serve` child with an admin token
//! file: hits over gRPC (`sluice query`), `/top` refused without the bearer and answered
//! with it, the gauges read from `/metrics`.

use crate::common::http;
use crate::process::{serve_ready, sluice};

const RULES: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5, name: per_user}
";

#[test]
fn top_answers_with_the_token_and_the_gauges_are_served() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("r.yaml"), RULES).unwrap();
    let token = root.path().join("admin-token");
    std::fs::write(&token, "t0ken-of-the-test\n").unwrap();
    let (_server, grpc, addr) = serve_ready(|c| {
        c.env("RUNTIME_ROOT", root.path())
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("ADMIN_TOKEN_FILE", &token);
    });
    let grpc_addr = format!("http://127.0.0.1:{grpc}");
    for (user, hits) in [("ann", 6), ("ben", 2)] {
        for _ in 0..hits {
            let out = sluice()
                .args(["query", "--addr", &grpc_addr, "--domain", "d"])
                .arg(format!("user={user}"))
                .output()
                .unwrap();
            assert!(
                !out.stdout.is_empty(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let (status, _, text) = http(addr, "GET", "/top", "", &[]).unwrap();
    assert_eq!(status, 401, "{text}");
    let bearer = [("Authorization", "Bearer t0ken-of-the-test")];
    let (status, _, text) = http(addr, "GET", "/top?domain=d&rule=per_user", "", &bearer).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{text}");
    assert_eq!(keys[0]["entries"][0]["value"], "ann");
    assert_eq!(keys[0]["name"], "per_user");
    assert_eq!(keys[0]["count"], 6, "the denied hit counts too (strict)");
    assert_eq!(keys[0]["ratio"], 1.2);
    assert_eq!(keys[1]["entries"][0]["value"], "ben");
    assert_eq!(keys[1]["ratio"], 0.4);
    let (status, _, text) = http(addr, "GET", "/top?n=5000", "", &bearer).unwrap();
    assert_eq!(status, 400, "{text}");
    let (_, _, metrics) = http(addr, "GET", "/metrics", "", &[]).unwrap();
    for (name, value) in [
        ("sluice_rule_limit", "5"),
        ("sluice_rule_unit_seconds", "3600"),
        ("sluice_rule_tracked_keys", "2"),
        ("sluice_rule_near_limit_keys", "1"),
        ("sluice_rule_over_limit_keys", "1"),
    ] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(r#"rule="d.user""#))
            .unwrap_or_else(|| panic!("no {name} for d.user in:\n{metrics}"));
        assert!(line.ends_with(&format!(" {value}")), "{line}");
    }
}
