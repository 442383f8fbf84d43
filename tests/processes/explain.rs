//! `sluice explain` against a `sluice serve` child: the text a person reads (the rule, its
//! file and line, the override, the count, why a descriptor matched nothing), `--json`, that
//! it counts nothing (gRPC's next answer sees the count unchanged), and what it says when no
//! server listens.

use crate::common::free_port;
use crate::process::{serve_ready, sluice};

const RULES: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5, name: per_user}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
    overrides:
      big: 50
";

fn explain(addr: &str, args: &[&str]) -> String {
    let out = sluice()
        .args(["explain", "--addr", addr, "--domain", "d"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn explain_prints_the_rule_its_line_and_the_count_and_counts_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("r.yaml"), RULES).unwrap();
    let (_server, grpc, http_addr) = serve_ready(|c| {
        c.env("RUNTIME_ROOT", root.path())
            .env("RUNTIME_SUBDIRECTORY", "ratelimit");
    });
    let grpc_addr = format!("http://127.0.0.1:{grpc}");
    let query = || {
        let out = sluice()
            .args(["query", "--addr", &grpc_addr, "--domain", "d", "user=q"])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(query()["statuses"][0]["limitRemaining"], 4);
    let addr = format!("http://{http_addr}");
    let mut text = String::new();
    for _ in 0..3 {
        text = explain(&addr, &["user=q", "tenant=big", "nokey=1"]);
    }
    for want in [
        "domain d: overall OK (nothing was counted)",
        "descriptor 1: user=q (1 hit(s))",
        "  rule d.user \"per_user\" (",
        "r.yaml, line 3)",
        "  limit 1: sliding_window 5 per HOUR: count 1, remaining 4, resets in ",
        "s -> OK",
        "descriptor 2: tenant=big (1 hit(s))",
        "  rule d.tenant_big (",
        "r.yaml, line 8)",
        "  an override of d.tenant",
        "  limit 1: sliding_window 50 per HOUR: count 0, remaining 50",
        "descriptor 3: nokey=1 (1 hit(s))",
        "  no rule: no node for key 'nokey' at level 1",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&explain(&addr, &["--json", "user=q"])).unwrap();
    assert_eq!(json["descriptors"][0]["limits"][0]["count"], 1, "{json}");
    assert_eq!(json["charged"], false);
    // The explanations counted nothing: the second real hit leaves 3.
    assert_eq!(query()["statuses"][0]["limitRemaining"], 3);
}

#[test]
fn explain_with_no_server_names_the_http_address_to_give() {
    let addr = format!("http://127.0.0.1:{}", free_port());
    let out = sluice()
        .args(["explain", "--addr", &addr, "--domain", "d", "k=v"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("sluice explain: cannot reach {addr}")) && err.contains("--addr"),
        "{err}"
    );
    let out = sluice()
        .args(["explain", "--domain", "d", "novalue"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}
