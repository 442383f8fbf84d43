//! `POST /reset` on two real replicas and a real Redis: a key at its limit is admitted again
//! on the replica asked at once and on the other within a sync tick, even one that gets no
//! request for it meanwhile (it reads the reset log each tick), and stays so (no replica's
//! statement or floor brings the count back); an `exact: true` rule's keys are deleted
//! (through `sluice reset`), and the key is admitted again at once.

use std::time::Duration;

use tokio::time::Instant;

use crate::common::procs::{query_in, spawn_sluice, wait_live, Proc};
use crate::common::redis::RedisServer;
use crate::common::{http, wait_until};

/// A sliding window of 20 an hour, decided by estimates (20 is above `EXACT_BELOW`), and an
/// exact one of 3 an hour.
const RULES: &str = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 20}\n  - key: x\n    rate_limit: {unit: hour, requests_per_unit: 3, exact: true}\n";
const TOKEN: &str = "fleet-admin-token";

struct Fleet {
    replicas: [Proc; 2],
    token: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn fleet(redis: &RedisServer) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("r.yaml"), RULES).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let env = [("ADMIN_TOKEN_FILE", token.to_str().unwrap())];
    let replicas = [
        spawn_sluice(&rules, &redis.url(), &env),
        spawn_sluice(&rules, &redis.url(), &env),
    ];
    for r in &replicas {
        wait_live(r, 2);
    }
    Fleet {
        replicas,
        token,
        _dir: dir,
    }
}

fn code(p: &Proc, key: &str) -> String {
    let v = query_in(p, "r", (key, "a"));
    v["overallCode"].as_str().unwrap_or_default().to_string()
}

fn reset(p: &Proc, key: &str) -> serde_json::Value {
    let body = format!(
        r#"{{"domain":"r","descriptors":[{{"entries":[{{"key":"{key}","value":"a"}}]}}]}}"#
    );
    let auth = format!("Bearer {TOKEN}");
    let (status, _, text) =
        http(p.http, "POST", "/reset", &body, &[("Authorization", &auth)]).unwrap();
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Queries `k` through `a` and `b` in turn until both deny (the fleet's count reached 20
/// and both read it), then lets a few ticks (100 ms each) pass without hits: every replica
/// has sent its hits and read the fleet's count, so each one's view is at the limit.
fn over_on_both(a: &Proc, b: &Proc) {
    wait_until(10, "both replicas to deny", || {
        let (x, y) = (code(a, "k"), code(b, "k"));
        x == "OVER_LIMIT" && y == "OVER_LIMIT"
    });
    std::thread::sleep(Duration::from_millis(300));
}

/// Queries `key` through `p` until it is admitted; how long that took and how many queries.
fn admitted_within(p: &Proc, key: &str) -> (Duration, u64) {
    let start = Instant::now();
    let mut queries = 0;
    wait_until(5, "the key admitted again", || {
        queries += 1;
        code(p, key) == "OK"
    });
    (start.elapsed(), queries)
}

#[test]
fn a_key_at_its_limit_is_admitted_again_on_both_replicas_within_a_tick_of_a_reset() {
    let redis = RedisServer::start();
    let f = fleet(&redis);
    let [a, b] = &f.replicas;
    over_on_both(a, b);
    let cleared = reset(a, "k");
    let limit = &cleared["descriptors"][0]["limits"][0];
    assert_eq!(cleared["descriptors"][0]["rule"], "r.k", "{cleared}");
    // The store's count: the last tick's hits of each replica may not have reached it.
    assert!(limit["count_before"].as_u64().unwrap() >= 15, "{cleared}");
    // The replica asked admits at once; the other within a tick (100 ms) of its next
    // request's sync: a few ticks allowed for a loaded machine.
    assert_eq!(code(a, "k"), "OK");
    let (took, polls) = admitted_within(b, "k");
    assert!(took < Duration::from_secs(1), "B admitted after {took:?}");
    // Every replica has synced the entity since (their statements of the old hits, their
    // floors of 20 and more): still far below the limit on both.
    std::thread::sleep(Duration::from_millis(500));
    for p in [a, b] {
        assert_eq!(code(p, "k"), "OK");
    }
    std::thread::sleep(Duration::from_millis(300));
    let keys = redis.cli(&["KEYS", "*sluice:v2:*"]);
    let mut total = 0i64;
    for k in keys.split_whitespace() {
        let fields = redis.cli(&["HGETALL", k]);
        let vals: Vec<&str> = fields.split_whitespace().collect();
        total += vals
            .chunks(2)
            .map(|c| c[1].parse::<i64>().unwrap())
            .sum::<i64>();
    }
    // Exactly the queries made since the reset (denied ones count too): the old count is
    // not back, and nothing since was lost.
    assert_eq!(total, 1 + polls as i64 + 2, "the store's count");
    let log = std::fs::read_to_string(a.log.path()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("counters reset"))
        .unwrap_or_else(|| panic!("no reset line:\n{log}"));
    assert!(line.contains("peer=127.0.0.1:"), "{line}");
    assert!(line.contains("token="), "{line}");
    assert!(!log.contains(TOKEN), "the token is in the log");
}

#[test]
fn an_exact_rules_keys_are_deleted_and_its_key_admitted_again_at_once() {
    let redis = RedisServer::start();
    let f = fleet(&redis);
    let [a, b] = &f.replicas;
    let codes: Vec<String> = (0..5).map(|i| code(&f.replicas[i % 2], "x")).collect();
    assert_eq!(codes, ["OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT"]);
    // Through `sluice reset`, which prints what the answer says.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "reset",
            "--addr",
            &format!("http://{}", b.http),
            "--token-file",
        ])
        .arg(&f.token)
        .args(["--domain", "r", "x=a"])
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cleared: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cleared["descriptors"][0]["exact"], true, "{cleared}");
    assert_eq!(
        cleared["descriptors"][0]["limits"][0]["count_before"], 3,
        "{cleared}"
    );
    let keys = redis.cli(&["KEYS", "*sluice:x:*"]);
    assert!(keys.trim().is_empty(), "exact keys left: {keys}");
    // At once on the replica asked; on the other once its memory of the key being over
    // (a tick at most) lapses. Then exactly 3 again, fleet-wide.
    assert_eq!(code(b, "x"), "OK");
    let (took, _) = admitted_within(a, "x");
    assert!(took < Duration::from_secs(1), "A admitted after {took:?}");
    let codes: Vec<String> = (0..3).map(|i| code(&f.replicas[i % 2], "x")).collect();
    assert_eq!(codes, ["OK", "OVER_LIMIT", "OVER_LIMIT"]);
}

/// This replica's count of `key` as `POST /explain` shows it (no hit, no sync).
fn explained_count(p: &Proc, key: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"r","descriptors":[{{"entries":[{{"key":"{key}","value":"a"}}]}}]}}"#
    );
    let (status, _, text) = http(p.http, "POST", "/explain", &body, &[]).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["descriptors"][0]["limits"][0]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count in {v}"))
}

#[test]
fn an_idle_replica_learns_of_a_reset_within_a_tick_without_a_request() {
    let redis = RedisServer::start();
    let f = fleet(&redis);
    let [a, b] = &f.replicas;
    over_on_both(a, b);
    assert!(explained_count(b, "k") >= 20, "B's view before the reset");
    reset(a, "k");
    // No request for the key on B: B learns of the reset from the reset log its heartbeat
    // reads each tick (100 ms; a few allowed for a loaded machine).
    wait_until(2, "B's view of the key cleared without a request", || {
        explained_count(b, "k") < 20
    });
    // B's first request after the reset is admitted.
    assert_eq!(code(b, "k"), "OK");
    assert_eq!(code(a, "k"), "OK");
    // B counted the entry it read.
    let (_, _, metrics) = http(b.http, "GET", "/metrics", "", &[]).unwrap();
    let applied: f64 = (metrics.lines())
        .find_map(|l| l.strip_prefix("sluice_reset_log_applied_total{"))
        .and_then(|rest| rest.split_once("} "))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sluice_reset_log_applied_total:\n{metrics}"));
    assert_eq!(applied, 1.0);
}
