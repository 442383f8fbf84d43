//! gRPC clients over TLS for the tests of sluice's TLS listener: rustls configurations that
//! trust a CA of `certs.rs` and present a client leaf, and one ShouldRateLimit call over them.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::certs::Pair;

/// The certificates of a PEM file.
pub fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A client configuration trusting `ca`, presenting `identity` when given; ALPN h2.
pub fn client_config(ca: &Path, identity: Option<&Pair>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca) {
        roots.add(c).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        Some(p) => builder
            .with_client_auth_cert(
                certs(&p.cert),
                PrivateKeyDer::from_pem_file(&p.key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A TLS connection to `addr` for the name `localhost`.
pub async fn tls_connect(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// One ShouldRateLimit call over a new TLS connection: the response, or why it failed.
/// Under TLS 1.3 the client finishes its handshake before the server checks the client
/// certificate, so a refusal may surface only at the call.
pub async fn should_rate_limit_tls(
    addr: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    req: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
) -> Result<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse, String> {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let config = config.clone();
        async move {
            tls_connect(addr, config)
                .await
                .map(hyper_util::rt::TokioIo::new)
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    RateLimitServiceClient::new(channel)
        .should_rate_limit(req)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|e| format!("call: {e:?}"))
}
