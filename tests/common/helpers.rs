//! Helpers every integration-test crate uses: descriptors, a minimal HTTP/1.1 client, polling
//! with a deadline, free ports, and lookups of external tools that fail loudly.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::core::clock::UnixMillis;
use tokio::time::Instant; // real time, as clippy.toml asks of latency and deadlines

/// The start of a minute (and of a day: 2023-11-15T00:00:00Z), so windows are easy to reason about.
pub const T0: UnixMillis = UnixMillis(1_700_006_400_000);

/// A descriptor from `(key, value)` pairs.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A response: status code, headers (lower-case names), body.
pub type HttpResponse = (u16, Vec<(String, String)>, String);

/// One HTTP/1.1 request with `Connection: close`.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response: {head}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, headers, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// [`http`] without blocking the runtime.
pub async fn http_async(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<HttpResponse> {
    let (m, p, b) = (method.to_string(), path.to_string(), body.to_string());
    tokio::task::spawn_blocking(move || http(addr, &m, &p, &b, &[]))
        .await
        .unwrap()
}

/// Polls `path` for up to 30 s until its body contains `needle`.
#[allow(dead_code)] // in_process and redis poll a server's page; processes does not
pub async fn wait_for_body(addr: SocketAddr, path: &str, needle: &str) {
    let what = format!("{path} to show {needle:?}");
    wait_until_async(30, &what, || async {
        http_async(addr, "GET", path, "")
            .await
            .is_ok_and(|r| r.2.contains(needle))
    })
    .await;
}

/// A header's value.
#[allow(dead_code)] // in_process and processes read headers; redis does not
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == &name.to_ascii_lowercase())
        .map(|(_, v)| v.as_str())
}

/// The path of an external program, or a test failure that says how to install it.
pub fn require_tool(name: &str, install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is not on PATH; this test needs it. Install it with: {install} (scripts/test.sh does this)")
        })
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How often the `wait_until*` helpers poll.
const POLL: Duration = Duration::from_millis(20);

/// Polls `cond` every 20 ms until it holds; fails naming `what` once `secs` seconds have
/// passed (deadlines are generous: they bound a hang, they do not measure speed).
#[allow(dead_code)] // redis and processes poll from blocking code; in_process only async
pub fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {secs}s waiting for {what}");
        }
        std::thread::sleep(POLL);
    }
}

/// [`wait_until`] for async tests: `cond` is awaited, and the runtime is not blocked
/// between polls.
pub async fn wait_until_async<F, Fut>(secs: u64, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if cond().await {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The repository root.
#[allow(dead_code)] // redis and processes read the repository's files; in_process does not
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
