//! Hot reload: a Kubernetes-ConfigMap-style directory (files are links through a `..data`
//! symlink that is swapped atomically), a rejected file that leaves the rules in force, and
//! counters of unchanged rules that survive a reload.

use std::os::unix::fs::symlink;
use std::path::Path;

use crate::common::{desc, http_async, wait_for_body, Server, T0};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const V1: &str = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: changed\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
const V2: &str = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: changed\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: added\n    rate_limit: {unit: minute, requests_per_unit: 9}\n";

/// Writes a ConfigMap volume's layout: `..<version>/rules.yaml`, `..data -> ..<version>`,
/// `rules.yaml -> ..data/rules.yaml`. Later versions swap `..data` with an atomic rename.
fn configmap_write(dir: &Path, version: &str, rules: &str) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir(&versioned).unwrap();
    std::fs::write(versioned.join("rules.yaml"), rules).unwrap();
    let tmp = dir.join("..data_tmp");
    symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if !dir.join("rules.yaml").exists() {
        symlink("..data/rules.yaml", dir.join("rules.yaml")).unwrap();
    }
}

async fn remaining(s: &Server, key: &str) -> (i32, u32) {
    let r = s
        .client()
        .await
        .should_rate_limit(RateLimitRequest {
            domain: "r".into(),
            descriptors: vec![desc(&[(key, "v")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    (r.overall_code, r.statuses[0].limit_remaining)
}

#[tokio::test]
async fn configmap_symlink_swap_reloads_and_keeps_unchanged_counters() {
    let dir = tempfile::tempdir().unwrap();
    configmap_write(dir.path(), "v1", V1);
    let s = Server::start_in(dir, |_| {}).await;
    assert_eq!(remaining(&s, "k").await, (1, 2));
    assert_eq!(remaining(&s, "k").await, (1, 1));
    assert_eq!(remaining(&s, "changed").await, (1, 0));
    assert_eq!(
        remaining(&s, "added").await,
        (1, 0),
        "no rule yet: OK, remaining 0"
    );

    configmap_write(s.dir.path(), "v2", V2);
    wait_for_body(s.http, "/rlconfig", "r.added").await;
    // Unchanged rule: its counter carried over (one hit left, not three).
    assert_eq!(remaining(&s, "k").await, (1, 0));
    // A changed rule is a new rule with fresh counters; the added rule applies.
    assert_eq!(remaining(&s, "changed").await, (1, 1));
    assert_eq!(remaining(&s, "added").await, (1, 8));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_bad_file_keeps_the_rules_in_force_until_fixed() {
    let s = Server::start(V1, |_| {}).await;
    assert_eq!(remaining(&s, "k").await, (1, 2));
    let (bad, v) = refused(&s, "zz-bad.yaml", "domain: r2\ndescriptors:\n  - key: x\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").await;
    let status = v.to_string();
    let err = v["errors"][0].as_str().unwrap();
    assert!(
        err.contains("zz-bad.yaml: invalid rate limit unit 'fortnight'"),
        "{status}"
    );
    assert!(v["errors_since_unix_ms"].is_u64(), "{status}");
    let (_, _, ready) = http_async(s.http, "GET", "/readyz", "").await.unwrap();
    assert!(ready.contains("last reload rejected"), "{ready}");

    // Fixed: the new file's rules join, the error clears.
    std::fs::write(&bad, "domain: r2\ndescriptors:\n  - key: x\n    rate_limit: {unit: hour, requests_per_unit: 1}\n").unwrap();
    wait_for_body(s.http, "/rlconfig", "r2.x: unit=HOUR").await;
    let (_, _, status) = http_async(s.http, "GET", "/rlconfig/status", "")
        .await
        .unwrap();
    assert!(status.contains(r#""errors":[]"#), "{status}");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_rule_that_would_deny_everything_is_refused_on_reload_with_its_line() {
    // Issue 19, item 10: a count one level too far out loaded as a limit of 0.
    let s = Server::start(V1, |_| {}).await;
    assert_eq!(remaining(&s, "k").await, (1, 2));
    let (_, v) = refused(&s, "zz-slip.yaml", "domain: r2\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n    requests_per_unit: 100\n").await;
    let status = v.to_string();
    let errors: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("zz-slip.yaml: config error, misplaced key 'requests_per_unit': it belongs inside 'rate_limit', one level further in (line 6, column 5; domain 'r2', descriptor path 'k')")),
        "{status}"
    );
    s.stop().await.unwrap();
}

/// Writes the bad rules file `name` beside V1's and waits for the reload to be refused;
/// checks that V1's rules still decide (their counter intact: one more hit of `k` leaves 1);
/// returns the file's path and `/rlconfig/status`.
async fn refused(s: &Server, name: &str, content: &str) -> (std::path::PathBuf, serde_json::Value) {
    let bad = s.dir.path().join(name);
    std::fs::write(&bad, content).unwrap();
    wait_for_body(
        s.http,
        "/metrics",
        r#"sluice_config_load_total{result="error"} 1"#,
    )
    .await;
    assert_eq!(remaining(s, "k").await, (1, 1));
    let (_, _, status) = http_async(s.http, "GET", "/rlconfig/status", "")
        .await
        .unwrap();
    (bad, serde_json::from_str(&status).unwrap())
}

/// Successful loads so far, from `/rlconfig/status`.
async fn loads(s: &Server) -> u64 {
    let (_, _, status) = http_async(s.http, "GET", "/rlconfig/status", "")
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    v["loads"].as_u64().unwrap()
}

#[tokio::test]
async fn the_rules_loaded_at_start_count_as_a_load() {
    let s = Server::start(V1, |_| {}).await;
    assert_eq!(loads(&s).await, 1, "the initial load is a load");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn reading_the_rules_never_reloads_them() {
    let s = Server::start(V1, |_| {}).await;
    let start = loads(&s).await;
    // What `cat`, a second sluice or `sluice check` do to the directory.
    for _ in 0..20 {
        for f in std::fs::read_dir(s.dir.path()).unwrap() {
            std::fs::read_to_string(f.unwrap().path()).unwrap();
        }
    }
    // Two real changes, each waited for: exactly two reloads, however much was read.
    let file = s.dir.path().join("rules.yaml");
    std::fs::write(&file, V2).unwrap();
    wait_for_body(s.http, "/rlconfig", "r.added").await;
    std::fs::write(&file, V1).unwrap();
    wait_for_body(
        s.http,
        "/rlconfig",
        "r.changed: unit=MINUTE requests_per_unit=1,",
    )
    .await;
    // A reload loop would run a reload every debounce period (50 ms here) from now on; give it
    // ten. This can only pass wrongly on a stalled machine, never fail wrongly.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(loads(&s).await, start + 2);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn default_algorithm_fixed_window_counts_the_rules_at_start_and_reloaded_in_fixed_windows() {
    use sluice::core::Algorithm;
    // `k` (3 a minute, no algorithm named) takes two hits in the first minute; half way
    // through the next, one more hit leaves what each algorithm leaves.
    let left_after_a_minute_and_a_half = |default_algorithm| async move {
        let s = Server::start(V1, |s| s.rules.default_algorithm = default_algorithm).await;
        assert_eq!(remaining(&s, "k").await, (1, 2));
        assert_eq!(remaining(&s, "k").await, (1, 1));
        s.clock.set(T0.plus_millis(90_000));
        let left = remaining(&s, "k").await;
        (s, left)
    };
    // Sliding, the default: the last minute's two hits still weigh half.
    let (sliding, left) = left_after_a_minute_and_a_half(Algorithm::SlidingWindow).await;
    assert_eq!(left, (1, 1));
    sliding.stop().await.unwrap();
    // Fixed: a new window, as the reference counts it.
    let (fixed, left) = left_after_a_minute_and_a_half(Algorithm::FixedWindow).await;
    assert_eq!(left, (1, 2));
    // The rules a reload brings are read the same way.
    std::fs::write(fixed.dir.path().join("rules.yaml"), V2).unwrap();
    wait_for_body(
        fixed.http,
        "/rlconfig",
        "r.added: unit=MINUTE requests_per_unit=9 algorithm=fixed_window,",
    )
    .await;
    fixed.stop().await.unwrap();
}
