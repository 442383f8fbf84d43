//! gRPC over TLS and mTLS on the real listener (in process, loopback), with certificates made
//! by openssl in each test: answers over TLS, handshakes refused without a client certificate,
//! with one from another CA or without the required SAN, certificate rotation picked up
//! without a restart, and settings resolved from real files.
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::certs::{self, Pair};
use crate::common::tls_client;
use crate::common::{desc, wait_until_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rustls::pki_types::CertificateDer;
use sluice::server::tls::{GrpcTls, ReloadingCert};
use sluice::settings::{ServeArgs, Settings};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

fn req() -> RateLimitRequest {
    RateLimitRequest {
        domain: "test".into(),
        descriptors: vec![desc(&[("k", "v")])],
        hits_addend: 0,
    }
}

async fn tls(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tls_client::tls_connect(addr, config).await
}

/// One ShouldRateLimit call over a new TLS connection: the overall code, or why it failed.
async fn call(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<i32, String> {
    tls_client::should_rate_limit_tls(addr, config, req())
        .await
        .map(|r| r.overall_code)
}

/// The server's certificate as a new connection sees it.
async fn served_cert(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> CertificateDer<'static> {
    let s = tls(addr, config).await.unwrap();
    s.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

struct Pki {
    dir: tempfile::TempDir,
    ca: Pair,
    server: Pair,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = certs::ca(dir.path(), "ca");
    let server = certs::server(dir.path(), "server", &ca);
    Pki { dir, ca, server }
}

fn grpc_tls(p: &Pki, client_ca: Option<&Path>, san: Option<&str>) -> GrpcTls {
    GrpcTls {
        cert: p.server.cert.clone(),
        key: p.server.key.clone(),
        client_ca: client_ca.map(Path::to_path_buf),
        client_san: san.map(str::to_string),
    }
}

#[tokio::test]
async fn a_tls_client_gets_answers_and_the_admin_port_stays_plain() {
    let p = pki();
    let tls = grpc_tls(&p, None, None);
    // Server::start waits for /readyz over plain HTTP.
    let server = Server::start(RULES, |s| s.grpc_tls = Some(tls)).await;
    let config = tls_client::client_config(&p.ca.cert, None);
    assert_eq!(call(server.grpc, config.clone()).await, Ok(1));
    assert_eq!(call(server.grpc, config).await, Ok(2), "over the limit");
    // A plaintext gRPC client gets nowhere.
    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await;
    let refused = match plain {
        Err(_) => true,
        Ok(mut c) => c.should_rate_limit(req()).await.is_err(),
    };
    assert!(refused, "plaintext gRPC must fail on a TLS listener");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let p = pki();
    let d = p.dir.path();
    let client = certs::leaf(d, "client", &p.ca, "clientAuth", "DNS:client.sluice.test");
    let other_ca = certs::ca(d, "other-ca");
    let stranger = certs::leaf(
        d,
        "stranger",
        &other_ca,
        "clientAuth",
        "DNS:client.sluice.test",
    );
    let tls = grpc_tls(&p, Some(&p.ca.cert), None);
    let server = Server::start(RULES, |s| s.grpc_tls = Some(tls)).await;
    let with = |id: Option<&Pair>| tls_client::client_config(&p.ca.cert, id);
    assert_eq!(call(server.grpc, with(Some(&client))).await, Ok(1));
    let none = call(server.grpc, with(None)).await;
    assert!(none.is_err(), "no client certificate: {none:?}");
    let foreign = call(server.grpc, with(Some(&stranger))).await;
    assert!(foreign.is_err(), "another CA's certificate: {foreign:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn the_client_certificate_must_carry_the_san() {
    let p = pki();
    let d = p.dir.path();
    let good = certs::leaf(d, "good", &p.ca, "clientAuth", "DNS:envoy.sluice.test");
    let wrong = certs::leaf(d, "wrong", &p.ca, "clientAuth", "DNS:other.sluice.test");
    let tls = grpc_tls(&p, Some(&p.ca.cert), Some("envoy.sluice.test"));
    let server = Server::start(RULES, |s| s.grpc_tls = Some(tls)).await;
    let with = |id: &Pair| tls_client::client_config(&p.ca.cert, Some(id));
    assert_eq!(call(server.grpc, with(&good)).await, Ok(1));
    let refused = call(server.grpc, with(&wrong)).await;
    assert!(refused.is_err(), "wrong SAN: {refused:?}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let p = pki();
    let tls = grpc_tls(&p, None, None);
    let server = Server::start(RULES, |s| s.grpc_tls = Some(tls)).await;
    let config = tls_client::client_config(&p.ca.cert, None);
    let first = tls_client::certs(&p.server.cert).remove(0);
    assert_eq!(served_cert(server.grpc, config.clone()).await, first);

    // A bad write first: the listener keeps serving the old pair.
    std::fs::write(&p.server.cert, "garbage").unwrap();
    assert_eq!(call(server.grpc, config.clone()).await, Ok(1));

    // Then the new pair, as a Secret rotation brings it (key and certificate, one by one).
    let next = certs::server(p.dir.path(), "next", &p.ca);
    std::fs::copy(&next.key, &p.server.key).unwrap();
    std::fs::copy(&next.cert, &p.server.cert).unwrap();
    let rotated = tls_client::certs(&next.cert).remove(0);
    assert_ne!(first, rotated);
    wait_until_async(10, "the rotated certificate to be served", || {
        let config = config.clone();
        let rotated = rotated.clone();
        async move { served_cert(server.grpc, config).await == rotated }
    })
    .await;
    assert_eq!(
        call(server.grpc, config).await,
        Ok(2),
        "same server, same counters"
    );
    server.stop().await.unwrap();
}

/// The resolver itself on a paused clock: a change is looked at once a second at most, a bad
/// pair keeps the previous one, and the next good write is taken.
#[tokio::test(start_paused = true)]
async fn the_resolver_rechecks_once_a_second_and_keeps_the_old_pair_on_a_bad_one() {
    let p = pki();
    let resolver = ReloadingCert::new(p.server.cert.clone(), p.server.key.clone()).unwrap();
    let leaf = |r: &ReloadingCert| r.current().cert[0].clone();
    let first = tls_client::certs(&p.server.cert).remove(0);
    let next = certs::server(p.dir.path(), "next", &p.ca);
    let rotated = tls_client::certs(&next.cert).remove(0);
    assert_eq!(leaf(&resolver), first);

    std::fs::write(&p.server.cert, "garbage").unwrap();
    tokio::time::advance(Duration::from_millis(1100)).await;
    assert_eq!(
        leaf(&resolver),
        first,
        "a bad certificate keeps the old pair"
    );

    std::fs::copy(&next.key, &p.server.key).unwrap();
    std::fs::copy(&next.cert, &p.server.cert).unwrap();
    assert_eq!(
        leaf(&resolver),
        first,
        "not looked at again within the second"
    );
    tokio::time::advance(Duration::from_millis(1100)).await;
    assert_eq!(leaf(&resolver), rotated);
}

#[test]
fn settings_load_the_files_and_name_a_key_that_does_not_match() {
    let p = pki();
    let other = certs::server(p.dir.path(), "other", &p.ca);
    let s = |v: &Path| v.to_str().unwrap().to_string();
    let args = ServeArgs::default()
        .with("GRPC_SERVER_USE_TLS", "true")
        .with("GRPC_SERVER_TLS_CERT", s(&p.server.cert))
        .with("GRPC_SERVER_TLS_KEY", s(&p.server.key))
        .with("GRPC_CLIENT_TLS_CACERT", s(&p.ca.cert))
        .with("GRPC_CLIENT_TLS_SAN", "envoy.sluice.test");
    let settings = Settings::resolve(&args, &sluice::settings::NoEnv).unwrap();
    assert_eq!(
        settings.grpc_tls,
        Some(grpc_tls(&p, Some(&p.ca.cert), Some("envoy.sluice.test")))
    );
    let errs = Settings::resolve(
        &args.with("GRPC_SERVER_TLS_KEY", s(&other.key)),
        &sluice::settings::NoEnv,
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].setting, "GRPC_SERVER_TLS_CERT");
    assert!(errs[0].message.contains("other.key"), "{}", errs[0]);
}

/// Below gRPC: a client without a certificate finishes its side of a TLS 1.3 handshake, then
/// reads the server's alert (or a close), never data.
#[tokio::test]
async fn a_refused_client_reads_an_error_not_data() {
    let p = pki();
    let tls = grpc_tls(&p, Some(&p.ca.cert), None);
    let server = Server::start(RULES, |s| s.grpc_tls = Some(tls)).await;
    let mut s = tls_conn(server.grpc, tls_client::client_config(&p.ca.cert, None)).await;
    let mut buf = [0u8; 1];
    let read = s.read(&mut buf).await;
    assert!(
        read.is_err() || read.unwrap() == 0,
        "the server must close or alert"
    );
    server.stop().await.unwrap();
}

async fn tls_conn(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    tls(addr, config).await.unwrap()
}

/// A client that completes the TLS handshake and then sends nothing is closed at the
/// handshake timeout (no HTTP/2 preface came), not held.
#[tokio::test]
async fn a_tls_client_that_idles_after_its_handshake_is_closed() {
    let p = pki();
    let tls = grpc_tls(&p, None, None);
    let server = Server::start(RULES, |s| {
        s.grpc_tls = Some(tls);
        s.grpc_limits.handshake_timeout = std::time::Duration::from_millis(500);
    })
    .await;
    let mut s = tls_conn(server.grpc, tls_client::client_config(&p.ca.cert, None)).await;
    // The server's own HTTP/2 SETTINGS come first, then the close.
    let mut got = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(15), s.read_to_end(&mut got))
        .await
        .expect("the server closes the connection");
    assert!(got.len() < 100, "{read:?}: read {got:?}");
    // Honest clients are still served.
    assert_eq!(
        call(server.grpc, tls_client::client_config(&p.ca.cert, None)).await,
        Ok(1)
    );
    server.stop().await.unwrap();
}
