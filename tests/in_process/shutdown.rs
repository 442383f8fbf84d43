//! Shutdown within one deadline (ARCHITECTURE.md, "Invariants"): whatever hangs (a gRPC call that never ends, a
//! client that never finishes its request, a Redis that never answers the final flush), `run`
//! returns within
//! `SHUTDOWN_GRACE` of the shutdown signal, and no decision is taken after the limiter closes.
//!
//! Time is tokio's paused clock, so the grace is measured in virtual time: the test is exact
//! and takes no wall-clock seconds.

use std::sync::Arc;
use std::time::Duration;

use crate::common;
use sluice::core::clock::ManualClock;
use sluice::global::redis::RedisOptions;
use sluice::settings::{RedisSettings, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// One HTTP/1.1 request on its own connection; returns the status line.
async fn request(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(start_paused = true)]
async fn stopping_fits_in_one_grace_period_whatever_hangs() {
    // A "Redis" that accepts connections and never answers: every store call, the final
    // flush included, runs to its timeout.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), RULES).unwrap();
    let loopback = "127.0.0.1:0".parse().unwrap();
    let mut settings = Settings::for_addrs(dir.path().to_path_buf(), loopback, loopback);
    settings.redis = Some(RedisSettings {
        urls: vec![format!("redis://{}", blackhole.local_addr().unwrap())],
        cluster: false,
        sentinel: None,
        options: RedisOptions {
            pool_size: 1,
            ..RedisOptions::default()
        },
    });
    let grace = Duration::from_secs(4);
    settings.shutdown_grace = grace;
    // A store call may take up to 10 s, longer than the whole grace. (The blackhole fails the
    // Redis client's connect after about a second; the gRPC watch below is what would hold
    // a stop that gave each step its own grace: 4 s of drain, then the flush, then HTTP.)
    settings.sync.timeout = Duration::from_secs(10);
    settings.http_header_read_timeout = Duration::from_secs(600);
    settings.http_idle_timeout = Duration::from_secs(600);

    let listeners = sluice::Listeners::bind(&settings).await.unwrap();
    let (grpc, http) = (
        listeners.grpc.local_addr().unwrap(),
        listeners.http.local_addr().unwrap(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let clock = Arc::new(ManualClock::new(common::T0));
    let service = tokio::spawn(sluice::run(settings, listeners, clock, async {
        let _ = stopped.await;
    }));

    // A gRPC call that never ends (a health watch): the gRPC drain waits for it until cut.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        watch.message().await.unwrap().is_some(),
        "the watch is open"
    );
    // A client that starts a request and never finishes it.
    let mut stalled = TcpStream::connect(http).await.unwrap();
    stalled
        .write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        .await
        .unwrap();
    // A counted hit, so the final flush has something to send (and serving has begun).
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    assert!(request(http, "POST", "/json", body).await.contains("200"));

    let begun = Instant::now();
    stop.send(()).unwrap();
    service.await.unwrap().unwrap();
    let took = begun.elapsed();
    assert!(
        took <= grace + Duration::from_millis(50),
        "stopping took {took:?}, over the {grace:?} grace"
    );
    drop((stalled, watch));
}
