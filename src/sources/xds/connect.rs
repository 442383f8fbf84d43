//! The channel to the management server: plain HTTP/2, or TLS made here with rustls (the
//! same provider and PEM loading as the gRPC listener's, `tls_files.rs`), since tonic is
//! built without its own TLS. The server is verified against `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`
//! or the system's roots, under the name `CONFIG_GRPC_XDS_SERVER_TLS_SAN` or the URL's host.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{XdsSettings, XdsTls};
use crate::tls_files::{self as tls, TlsError};

/// How long one connection attempt (TCP and TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the management server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL is not `host:port`.
    #[error("CONFIG_GRPC_XDS_SERVER_URL '{0}' is not host:port")]
    Url(String),
    /// A TLS file or setting is unusable.
    #[error("TLS to the xDS server: {0}")]
    Tls(#[from] TlsError),
    /// The connection failed.
    #[error("cannot connect: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The URL as an endpoint: `host:port`, as the reference's `grpc.Dial` takes it.
///
/// # Errors
/// [`ConnectError::Url`] when it is not `host:port`.
pub fn endpoint(url: &str) -> Result<(Endpoint, String), ConnectError> {
    let bad = || ConnectError::Url(url.to_string());
    let uri: Uri = format!("http://{url}").parse().map_err(|_| bad())?;
    let (Some(host), Some(_)) = (uri.host(), uri.port_u16()) else {
        return Err(bad());
    };
    if uri.path() != "/" || url.contains('/') {
        return Err(bad());
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let endpoint = Endpoint::from(uri)
        .connect_timeout(CONNECT_TIMEOUT)
        // A management server that vanishes without closing the connection is noticed.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    Ok((endpoint, host))
}

/// The rustls client configuration for `tls`, reading its files.
///
/// # Errors
/// When a file is unreadable or the pair does not match.
pub fn client_config(tls: &XdsTls) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = match &tls.server_ca {
        Some(ca) => tls::load_roots(ca)?,
        None => system_roots(),
    };
    let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(tls::load_certs(cert)?, tls::load_private_key(key)?)
            .map_err(|source| TlsError::Pair {
                cert: cert.clone(),
                key: key.clone(),
                source,
            })?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The system's CA certificates; the unusable ones are logged and skipped.
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "a system CA certificate could not be read");
    }
    let mut roots = RootCertStore::empty();
    let (added, skipped) = roots.add_parsable_certificates(found.certs);
    tracing::debug!(added, skipped, "system CA certificates for the xDS server");
    roots
}

/// Connects to the management server.
///
/// # Errors
/// When the URL, the TLS files or the connection fail.
pub async fn channel(settings: &XdsSettings) -> Result<Channel, ConnectError> {
    let (endpoint, host) = endpoint(&settings.server_url)?;
    let Some(tls) = &settings.tls else {
        return Ok(endpoint.connect().await?);
    };
    // Read on every attempt, so rotated files are picked up by the next connection.
    let config = client_config(tls)?;
    let name = tls.server_san.as_deref().unwrap_or(&host);
    let name = tls::parse_san(name)?;
    let addr = settings.server_url.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let (config, name, addr) = (config.clone(), name.clone(), addr.clone());
        async move {
            let handshake = async {
                let tcp = TcpStream::connect(addr.as_str()).await?;
                tcp.set_nodelay(true)?;
                tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
            };
            match tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
                Ok(stream) => stream.map(TokioIo::new),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TLS connection timed out",
                )),
            }
        }
    });
    Ok(endpoint.connect_with_connector(connector).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_host_and_port() {
        assert_eq!(endpoint("localhost:18000").unwrap().1, "localhost");
        assert_eq!(endpoint("[::1]:18000").unwrap().1, "::1");
        for bad in ["localhost", "http://x:1", "x:1/path", ""] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
    }
}
