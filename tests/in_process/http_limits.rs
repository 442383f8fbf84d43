//! The admin and gRPC ports' connection bounds, on in-process servers with small limits: a
//! header that never completes, a body that stalls, connections past the cap waiting for a
//! slot, shutdown with connections open; on gRPC, streams opened and never finished, requests
//! in flight past the process's bound, streams the client makes the server reset, silent and
//! idle connections. (The real process under a flood of idle connections is in `process.rs`.)

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common;
use axum::routing::{get, post};
use axum::Router;
use sluice::server::http::{serve, HttpLimits};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Deadlines here are generous bounds on waiting, never assertions of speed.
const PATIENCE: Duration = Duration::from_secs(15);

struct Admin {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn start(limits: HttpLimits) -> Admin {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/echo", post(|body: String| async move { body }));
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, router, limits, async {
        let _ = rx.await;
    }));
    Admin { addr, stop, task }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Reads until the server closes the connection; panics if it is still open after
/// [`PATIENCE`]. Returns what was read.
fn read_until_closed(mut s: TcpStream) -> String {
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        // A reset is a close too (the server may drop unread bytes).
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("connection still open after {PATIENCE:?} ({e}); read {got:?}"),
    }
    String::from_utf8_lossy(&got).into_owned()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test]
async fn a_header_that_never_completes_is_closed_after_the_header_timeout() {
    let admin = start(HttpLimits {
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(600),
        max_connections: 8,
    })
    .await;
    let mut partial = connect(admin.addr);
    partial
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let silent = connect(admin.addr);
    let (a, b) = blocking(move || (read_until_closed(partial), read_until_closed(silent))).await;
    assert!(!a.contains("hello") && !b.contains("hello"), "{a:?} {b:?}");

    // A complete request is still served on a fresh connection.
    let addr = admin.addr;
    let (status, _, body) = blocking(move || common::http(addr, "GET", "/", "", &[]))
        .await
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "hello"));
    let _ = admin.stop.send(());
    admin.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_stalled_body_is_closed_after_the_idle_timeout() {
    // The header timeout is out of reach; only the idle timeout can end this connection.
    let admin = start(HttpLimits {
        header_read_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_millis(300),
        max_connections: 8,
    })
    .await;
    let mut s = connect(admin.addr);
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
        .unwrap();
    let got = blocking(move || read_until_closed(s)).await;
    assert!(!got.contains("ab"), "{got:?}");
    let _ = admin.stop.send(());
    admin.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn past_the_cap_a_connection_waits_for_a_slot_then_is_served() {
    let admin = start(HttpLimits {
        header_read_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        max_connections: 2,
    })
    .await;
    // Two idle connections take both slots (the kernel hands connections to accept in order).
    let mut idle: Vec<TcpStream> = (0..2).map(|_| connect(admin.addr)).collect();
    let mut third = connect(admin.addr);
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    // Not served while the cap is reached: nothing to read yet.
    third.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let early = third.read(&mut byte);
    assert!(
        matches!(&early, Err(e) if e.kind() == ErrorKind::WouldBlock),
        "answered past the cap: {early:?}"
    );
    third.set_nonblocking(false).unwrap();

    // One idle client leaves: its slot goes to the waiting connection.
    drop(idle.pop());
    let got = blocking(move || read_until_closed(third)).await;
    assert!(
        got.starts_with("HTTP/1.1 200") && got.ends_with("hello"),
        "{got:?}"
    );

    // Shutdown with an idle connection still open: it is closed and serve returns.
    let lingering = connect(admin.addr);
    let _ = admin.stop.send(());
    tokio::time::timeout(PATIENCE, admin.task)
        .await
        .expect("serve returned after shutdown")
        .unwrap()
        .unwrap();
    blocking(move || read_until_closed(lingering)).await;
    drop(idle);
}

#[tokio::test]
async fn the_settings_reach_the_admin_port() {
    // The whole service, with HTTP_HEADER_READ_TIMEOUT=300ms: a silent connection is closed
    // long before the default 10 s would close it (5 s of patience: 16 times the setting).
    let s = common::Server::start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        |s| s.http_header_read_timeout = Duration::from_millis(300),
    )
    .await;
    let silent = connect(s.http);
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let got = blocking(move || read_until_closed(silent)).await;
    assert!(got.is_empty() || got.contains("408"), "{got:?}");
    s.stop().await.unwrap();
}

// === the gRPC port ===

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// An HTTP/2 connection to the gRPC port, its driver polled by a task of its own.
async fn h2_client(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    client
}

/// A ShouldRateLimit stream of headers only: the body never comes.
fn held_stream(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: SocketAddr,
) -> h2::client::ResponseFuture {
    held_stream_with(client, addr, http::HeaderMap::new())
}

/// [`held_stream`] with more headers.
fn held_stream_with(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: SocketAddr,
    headers: http::HeaderMap,
) -> h2::client::ResponseFuture {
    let mut req = http::Request::post(format!(
        "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    req.headers_mut().extend(headers);
    let (resp, _body) = client.send_request(req, false).unwrap();
    resp
}

fn grpc_status(resp: &http::Response<h2::RecvStream>) -> Option<String> {
    resp.headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string())
}

async fn ask(s: &common::Server) -> Result<(), tonic::Status> {
    let req = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![common::desc(&[("k", "v")])],
        hits_addend: 0,
    };
    s.client().await.should_rate_limit(req).await.map(|_| ())
}

#[tokio::test]
async fn grpc_streams_per_connection_are_bounded_and_announced() {
    let s = common::Server::start(RULES, |s| s.grpc_limits.max_concurrent_streams = 2).await;
    let tcp = tokio::net::TcpStream::connect(s.grpc).await.unwrap();
    let (_client, conn) = h2::client::handshake(tcp).await.unwrap();
    let mut conn = Box::pin(conn);
    let mut ping = conn.ping_pong().unwrap();
    // A ping's answer comes after the server's SETTINGS.
    tokio::select! {
        r = conn.as_mut() => panic!("connection closed: {r:?}"),
        p = ping.ping(h2::Ping::opaque()) => { p.unwrap(); }
    }
    assert_eq!(conn.max_concurrent_send_streams(), 2);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_stream_that_never_finishes_is_answered_at_the_request_timeout() {
    let s = common::Server::start(RULES, |s| {
        s.grpc_limits.request_timeout = Duration::from_millis(300)
    })
    .await;
    let mut client = h2_client(s.grpc).await;
    let resp = tokio::time::timeout(PATIENCE, held_stream(&mut client, s.grpc))
        .await
        .expect("an answer at the request timeout")
        .unwrap();
    // CANCELLED: tonic's answer to a request past its timeout.
    assert_eq!(grpc_status(&resp).as_deref(), Some("1"));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_clients_grpc_timeout_shorter_than_the_request_timeout_is_kept() {
    let s = common::Server::start(RULES, |s| {
        s.grpc_limits.request_timeout = Duration::from_secs(600)
    })
    .await;
    let mut client = h2_client(s.grpc).await;
    let mut headers = http::HeaderMap::new();
    headers.insert("grpc-timeout", http::HeaderValue::from_static("300m"));
    let resp = tokio::time::timeout(PATIENCE, held_stream_with(&mut client, s.grpc, headers))
        .await
        .expect("an answer at the client's deadline, long before the request timeout")
        .unwrap();
    assert_eq!(grpc_status(&resp).as_deref(), Some("1"));
    // A malformed deadline is ignored: the request timeout holds.
    let mut headers = http::HeaderMap::new();
    headers.insert("grpc-timeout", http::HeaderValue::from_static("300x"));
    let held = held_stream_with(&mut client, s.grpc, headers);
    let waited = tokio::time::timeout(Duration::from_secs(2), held).await;
    assert!(
        waited.is_err(),
        "answered before the request timeout: {waited:?}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_client_that_makes_the_server_reset_streams_is_closed_past_the_bound() {
    let s = common::Server::start(RULES, |_| {}).await;
    let tcp = tokio::net::TcpStream::connect(s.grpc).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    // Each stream's body overruns its `content-length`: the server resets the stream, and
    // past 1,024 such resets it closes the connection.
    let mut sent = 0;
    while sent < 1_100 {
        let Ok(ready) = client.ready().await else {
            break;
        };
        client = ready;
        let req = http::Request::post(format!(
            "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            s.grpc
        ))
        .header("content-type", "application/grpc")
        .header("content-length", "1")
        .body(())
        .unwrap();
        let Ok((resp, mut body)) = client.send_request(req, false) else {
            break;
        };
        sent += 1;
        if body
            .send_data(bytes::Bytes::from_static(b"ab"), true)
            .is_err()
        {
            break;
        }
        let _ = resp.await;
    }
    let closed = tokio::time::timeout(PATIENCE, conn)
        .await
        .expect("the connection is closed")
        .unwrap();
    let reason = closed.expect_err("closed by the server").reason();
    assert_eq!(
        reason,
        Some(h2::Reason::ENHANCE_YOUR_CALM),
        "after {sent} streams"
    );
    assert!(sent > 1_024, "closed after {sent} streams");
    // Other connections are served.
    ask(&s).await.unwrap();
    s.stop().await.unwrap();
}

#[tokio::test]
async fn requests_in_flight_past_the_bound_are_refused_and_freed_when_their_connection_goes() {
    let s = common::Server::start(RULES, |s| {
        s.grpc_limits.max_concurrent_requests = 3;
        s.grpc_limits.request_timeout = Duration::from_secs(60);
    })
    .await;
    let mut client = h2_client(s.grpc).await;
    let held: Vec<_> = (0..3).map(|_| held_stream(&mut client, s.grpc)).collect();
    common::wait_until_async(15, "an honest call to be refused", || async {
        matches!(ask(&s).await, Err(st) if st.code() == tonic::Code::ResourceExhausted)
    })
    .await;
    // The client goes: its requests no longer count.
    drop((held, client));
    common::wait_until_async(15, "an honest call to be answered", || async {
        ask(&s).await.is_ok()
    })
    .await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_silent_grpc_connection_is_closed_at_the_handshake_timeout_and_an_idle_one_later() {
    let s = common::Server::start(RULES, |s| {
        s.grpc_limits.handshake_timeout = Duration::from_millis(300);
        s.grpc_limits.idle_timeout = Duration::from_millis(600);
    })
    .await;
    let silent = connect(s.grpc);
    blocking(move || read_until_closed(silent)).await;
    // Past its preface, a connection whose client then sends nothing is closed at the idle
    // timeout (its driver ends).
    let tcp = tokio::net::TcpStream::connect(s.grpc).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    // The driver ends with the server's close (an error: no GOAWAY for an idle client).
    let _ = tokio::time::timeout(PATIENCE, conn)
        .await
        .expect("the idle connection is closed");
    drop(client);
    // The service still answers.
    ask(&s).await.unwrap();
    s.stop().await.unwrap();
}

#[tokio::test]
async fn grpc_connections_past_the_cap_wait_for_a_slot() {
    let s = common::Server::start(RULES, |s| {
        s.grpc_limits.max_connections = 2;
        s.grpc_limits.handshake_timeout = Duration::from_secs(60);
    })
    .await;
    let (a, b) = (connect(s.grpc), connect(s.grpc));
    // Two silent connections hold both slots: a client waits in the accept queue.
    let waiting = tokio::time::timeout(Duration::from_millis(500), ask(&s)).await;
    assert!(waiting.is_err(), "answered past the cap: {waiting:?}");
    drop(a);
    tokio::time::timeout(PATIENCE, ask(&s))
        .await
        .expect("a slot freed")
        .unwrap();
    drop(b);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_rapid_reset_flood_leaves_honest_calls_answered() {
    // HTTP/2 "rapid reset": streams opened and reset at once. Each costs the server a bounded
    // amount of work (h2 ends the connection with GOAWAY when resets pile up before they
    // are accepted), and a call on another connection is answered meanwhile.
    let s = common::Server::start(RULES, |_| {}).await;
    let tcp = tokio::net::TcpStream::connect(s.grpc).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let addr = s.grpc;
    let flood = tokio::spawn(async move {
        for _ in 0..50_000 {
            let Ok(ready) = client.ready().await else {
                return; // GOAWAY
            };
            client = ready;
            let req = http::Request::post(format!(
                "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
            ))
            .body(())
            .unwrap();
            match client.send_request(req, false) {
                Ok((_, mut body)) => body.send_reset(h2::Reason::CANCEL),
                Err(_) => return,
            }
        }
    });
    for _ in 0..20 {
        ask(&s).await.unwrap();
    }
    tokio::time::timeout(PATIENCE, flood)
        .await
        .unwrap()
        .unwrap();
    ask(&s).await.unwrap();
    s.stop().await.unwrap();
}
