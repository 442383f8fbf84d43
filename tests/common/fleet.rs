//! Real sluice processes for the fleet tests: start one on free ports against a Redis, and
//! wait until the heartbeats of a fleet count every replica.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use super::{free_port, http, wait_until};

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

/// Starts `sluice serve` on free ports with `rules_dir`, Redis at `redis_url`, a 100 ms tick
/// (sync interval 200 ms) and `extra_env`; waits until it is ready.
pub fn spawn_sluice(
    rules_dir: &std::path::Path,
    redis_url: &str,
    extra_env: &[(&str, &str)],
) -> Proc {
    let (grpc, port) = (free_port(), free_port());
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
    let child = c.spawn().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(20, "sluice ready", || {
        matches!(http(addr, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
    Proc {
        child,
        http: addr,
        log,
    }
}

/// Waits until `p`'s heartbeats count `n` live replicas (its `sluice_sync_live_replicas`).
pub fn wait_live(p: &Proc, n: u32) {
    let want = format!("sluice_sync_live_replicas {n}\n");
    wait_until(20, "the heartbeats to count the fleet", || {
        http(p.http, "GET", "/metrics", "", &[]).is_ok_and(|(_, _, body)| body.contains(&want))
    });
}
