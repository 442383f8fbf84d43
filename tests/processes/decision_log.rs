//! The decision log of a real `sluice serve`: at `LOG_LEVEL=debug`, a line per descriptor
//! decided naming its rule and code, the descriptors' keys but not their values, and none of
//! the dependencies' HTTP/2 frame dumps; sampled at info with `DECISION_LOG_RATE`, values
//! shown with `DECISION_LOG_VALUES`.

use std::net::SocketAddr;
use std::process::{Child, Stdio};

use crate::common::{free_port, http, wait_until};
use crate::process::{sigterm_with_an_idle_connection_then_log, sluice};

const RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: trial\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

/// A server on [`RULES`] with `env`, ready; its gRPC port.
fn serve(dir: &std::path::Path, env: &[(&str, &str)]) -> (Child, u16) {
    std::fs::write(dir.join("d.yaml"), RULES).unwrap();
    let (grpc, port) = (free_port(), free_port());
    let child = sluice()
        .arg("serve")
        .arg("--config")
        .arg(dir)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{port}")])
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(20, "ready", || {
        matches!(http(addr, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
    (child, grpc)
}

fn query(grpc: u16, entry: &str) {
    let out = sluice()
        .args(["query", "--addr", &format!("http://127.0.0.1:{grpc}")])
        .args(["--domain", "d", entry])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn at_debug_each_decision_is_a_line_naming_its_rule_without_values_or_frame_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, grpc) = serve(dir.path(), &[("LOG_LEVEL", "debug")]);
    for entry in [
        "user=alice",
        "user=alice",
        "trial=bob",
        "trial=bob",
        "other=carol",
    ] {
        query(grpc, entry);
    }
    let log = sigterm_with_an_idle_connection_then_log(&mut child, grpc);
    let decisions: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("sluice::decision"))
        .collect();
    assert_eq!(decisions.len(), 5, "{log}");
    for (line, want) in decisions.iter().zip([
        r#"rule="d.user" code="OK" count=1 limit=1 descriptor=user"#,
        r#"rule="d.user" code="OVER_LIMIT" count=2 limit=1 descriptor=user"#,
        r#"rule="d.trial" code="OK" count=1 limit=1 descriptor=trial"#,
        r#"rule="d.trial" code="SHADOW" count=2 limit=1 descriptor=trial"#,
        r#"rule="no rule" code="NO_RULE" count=0 limit=0 descriptor=other"#,
    ]) {
        assert!(
            line.contains(want) && line.contains(r#"domain="d""#),
            "{want} in {line}"
        );
    }
    for secret in ["alice", "bob", "carol"] {
        assert!(!log.contains(secret), "{secret} logged:\n{log}");
    }
    // The dependencies stay at info: no HTTP/2 frames, hyper or tower lines.
    for dependency in ["h2::", "hyper", "tower", "tonic::"] {
        assert!(!log.contains(dependency), "{dependency} at debug:\n{log}");
    }
}

#[test]
fn a_sampled_decision_log_at_info_keeps_to_its_rate_and_shows_values_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("DECISION_LOG_RATE", "1"), ("DECISION_LOG_VALUES", "true")];
    let (mut child, grpc) = serve(dir.path(), &env);
    let out = sluice()
        .args(["load", "--addr", &format!("http://127.0.0.1:{grpc}")])
        .args(["--domain", "d", "--key", "user", "--values", "5"])
        .args(["--concurrency", "4", "--duration", "1s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let sent: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let log = sigterm_with_an_idle_connection_then_log(&mut child, grpc);
    let sampled = log
        .lines()
        .filter(|l| l.contains("decision (sampled)"))
        .count();
    // One a second, one at once: a few lines for the hundreds of decisions in a second.
    assert!(sent >= 100, "{text}");
    assert!(
        (1..=5).contains(&sampled),
        "{sampled} lines for {sent} requests:\n{log}"
    );
    assert!(log.contains("descriptor=user=v"), "values shown:\n{log}");
    assert!(!log.contains("DEBUG"), "{log}");
}
