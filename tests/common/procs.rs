//! Real sluice processes for multi-process tests: spawned with `serve` on free loopback
//! ports (waited on until ready, or not: replicas started together), asked through
//! `POST /json`, waited on until their heartbeats count the fleet, killed when dropped.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use super::{free_port, http, wait_until};

/// Held by each test that measures a fleet of sluice processes against a tolerance (what
/// the simulator predicts, a bucket's bound), for the whole test: what such a fleet admits
/// depends on its processes getting the CPU on time, and two fleets measured at once on a
/// 2-core machine overshoot. Tests that only check what a fleet does, not how much it
/// admits, run beside them.
pub static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A sluice process; killed when dropped. Its log goes to `log`.
pub struct Proc {
    pub child: Child,
    pub http: SocketAddr,
    pub log: tempfile::NamedTempFile,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sluice process serving the rules in `rules_dir`, in global mode on `redis_url`, with a
/// 100 ms tick and a 200 ms sync interval unless `extra_env` says otherwise.
pub fn spawn_sluice(
    rules_dir: &std::path::Path,
    redis_url: &str,
    extra_env: &[(&str, &str)],
) -> Proc {
    spawn_sluice_on(rules_dir, redis_url, extra_env, free_port(), free_port())
}

/// [`spawn_sluice`] on the given gRPC and HTTP ports: a replica restarted where its clients
/// (an Envoy's static cluster) expect it.
pub fn spawn_sluice_on(
    rules_dir: &std::path::Path,
    redis_url: &str,
    extra_env: &[(&str, &str)],
    grpc: u16,
    port: u16,
) -> Proc {
    let p = start(rules_dir, redis_url, extra_env, grpc, port);
    wait_ready(&p);
    p
}

/// [`spawn_sluice`] without waiting for it to be ready: replicas started together.
pub fn spawn_sluice_unready(
    rules_dir: &std::path::Path,
    redis_url: &str,
    extra_env: &[(&str, &str)],
) -> Proc {
    start(rules_dir, redis_url, extra_env, free_port(), free_port())
}

/// Waits until `p` reports ready (`/readyz` 200).
pub fn wait_ready(p: &Proc) {
    wait_until(20, "sluice ready", || {
        matches!(http(p.http, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
}

fn start(
    rules_dir: &std::path::Path,
    redis_url: &str,
    extra_env: &[(&str, &str)],
    grpc: u16,
    port: u16,
) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env_clear()
        .args(["serve", "--config"])
        .arg(rules_dir)
        .args([
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--http-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .env("REDIS_URL", redis_url)
        .env("SYNC_TICK", "100ms")
        .env("SYNC_INTERVAL", "200ms")
        .env("LOG_LEVEL", "debug");
    let log = tempfile::NamedTempFile::new().unwrap();
    c.stderr(Stdio::from(log.reopen().unwrap()));
    for (k, v) in extra_env {
        c.env(k, v);
    }
    Proc {
        child: c.spawn().unwrap(),
        http: format!("127.0.0.1:{port}").parse().unwrap(),
        log,
    }
}

/// One hit on `k=value` of domain `g`, as JSON.
pub fn query(p: &Proc, value: &str) -> serde_json::Value {
    query_in(p, "g", ("k", value))
}

/// One descriptor (`key`, `value`) of `domain` through `p`'s `POST /json`: the response.
pub fn query_in(p: &Proc, domain: &str, (key, value): (&str, &str)) -> serde_json::Value {
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    );
    let (_, _, text) = http(p.http, "POST", "/json", &body, &[]).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"))
}

/// Two replicas on `redis_url` serving the repository's `config/rules`, once each counts
/// both.
pub fn two_replicas(redis_url: &str) -> [Proc; 2] {
    let rules = crate::common::repo().join("config/rules");
    let replicas = [
        spawn_sluice(&rules, redis_url, &[]),
        spawn_sluice(&rules, redis_url, &[]),
    ];
    for r in &replicas {
        wait_live(r, 2);
    }
    replicas
}

/// Waits until `p`'s heartbeats count `n` live replicas (its `sluice_sync_live_replicas`).
pub fn wait_live(p: &Proc, n: u32) {
    let want = format!("sluice_sync_live_replicas {n}\n");
    wait_until(20, "the heartbeats to count the fleet", || {
        http(p.http, "GET", "/metrics", "", &[]).is_ok_and(|(_, _, body)| body.contains(&want))
    });
}

/// Where `p` serves gRPC (`ShouldRateLimit`), as its log says once it serves.
pub fn grpc_addr(p: &Proc) -> SocketAddr {
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    log.split("serving grpc=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no gRPC address in the log:\n{log}"))
}
