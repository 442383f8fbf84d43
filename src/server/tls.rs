//! TLS and mTLS on the gRPC listener (`GRPC_SERVER_USE_TLS` and friends), with rustls.
//!
//! The server certificate is re-read when its files change ([`ReloadingCert`]), as Kubernetes
//! rotates a mounted Secret, so a rotation needs no restart. With a client CA the client must
//! present a certificate chaining to it and, when a SAN is set, valid for that name.
//!
//! The handshake happens here, before tonic sees the connection ([`incoming`]): tonic's own TLS
//! takes a fixed identity, and a certificate that changes needs rustls' resolver hook.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
// tokio's, as clippy.toml asks of intervals that are not rate-limit time.
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

pub(crate) use crate::tls_files::provider;
pub use crate::tls_files::{
    load_certified_key, load_certs, load_private_key, load_roots, parse_san, TlsError,
};

/// The gRPC listener's TLS settings, checked at start (`Settings::resolve` loads every file
/// once, so a bad file stops the start naming it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcTls {
    /// PEM certificate chain, leaf first (`GRPC_SERVER_TLS_CERT`).
    pub cert: PathBuf,
    /// PEM private key (`GRPC_SERVER_TLS_KEY`).
    pub key: PathBuf,
    /// PEM CA bundle clients must chain to; set, a client certificate is required
    /// (`GRPC_CLIENT_TLS_CACERT`).
    pub client_ca: Option<PathBuf>,
    /// A DNS name or IP address the client certificate must carry as a SAN
    /// (`GRPC_CLIENT_TLS_SAN`).
    pub client_san: Option<String>,
}

/// Builds the rustls server configuration: reloading certificate, client verification when a
/// CA is set, ALPN h2 (gRPC).
pub fn server_config(tls: &GrpcTls) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(load_roots(ca)?);
            let webpki = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            let verifier: Arc<dyn ClientCertVerifier> = match &tls.client_san {
                Some(san) => Arc::new(SanVerifier {
                    inner: webpki,
                    san: parse_san(san)?,
                }),
                None => webpki,
            };
            builder.with_client_cert_verifier(verifier)
        }
    };
    let resolver = ReloadingCert::new(tls.cert.clone(), tls.key.clone())?;
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How often at most the certificate files are looked at.
const RECHECK: Duration = Duration::from_secs(1);

/// The server certificate, re-read when its files' modification time or length changes
/// (looked at during a handshake, at most once per [`RECHECK`]). A bad new pair is logged and
/// the previous one kept, so a half-written rotation does not take the listener down.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    state: Mutex<CertState>,
}

#[derive(Debug)]
struct CertState {
    current: Arc<CertifiedKey>,
    checked: Instant,
    stamp: Stamp,
}

/// What tells a file changed: (modified, length) of the certificate and of the key. Metadata
/// follows symlinks, so Kubernetes' `..data` swap shows as a change.
type Stamp = [Option<(SystemTime, u64)>; 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    };
    [one(cert), one(key)]
}

impl ReloadingCert {
    /// Loads the pair once.
    ///
    /// # Errors
    /// [`TlsError`] naming the file when the pair is unusable.
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<ReloadingCert, TlsError> {
        let stamp = stamp(&cert, &key);
        let current = Arc::new(load_certified_key(&cert, &key)?);
        Ok(ReloadingCert {
            state: Mutex::new(CertState {
                current,
                checked: Instant::now(),
                stamp,
            }),
            cert,
            key,
        })
    }

    /// The pair a handshake gets now, re-read first if due and changed. Runs inside the
    /// handshake, on the runtime: two `stat`s a second at most, and a read of two small files
    /// on a change.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock();
        if state.checked.elapsed() < RECHECK {
            return state.current.clone();
        }
        state.checked = Instant::now();
        let now = stamp(&self.cert, &self.key);
        if now == state.stamp {
            return state.current.clone();
        }
        // Remember the stamp even on failure: one warning per change, and a later write (the
        // missing half of the pair) is a new change that is tried again.
        state.stamp = now;
        match load_certified_key(&self.cert, &self.key) {
            Ok(key) => {
                tracing::info!(cert = %self.cert.display(), "gRPC TLS certificate reloaded");
                state.current = Arc::new(key);
            }
            Err(e) => {
                tracing::warn!(error = %e, "gRPC TLS certificate not reloaded; keeping the previous one");
            }
        }
        state.current.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The CA check, then the SAN check (`GRPC_CLIENT_TLS_SAN`): the leaf must be valid for the
/// name as webpki checks a server's (DNS SANs, wildcards included, or IP SANs).
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl ClientCertVerifier for SanVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let leaf = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        leaf.verify_is_valid_for_subject_name(&self.san)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A TLS connection tonic can serve (it needs `Connected` for the peer address).
pub struct TlsConn(TlsStream<TcpStream>);

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The TLS handshake of an accepted gRPC connection, for `grpc_conn::incoming` (which bounds
/// its time and the connections' number).
pub fn handshake(
    config: Arc<rustls::ServerConfig>,
) -> impl Fn(TcpStream) -> Pin<Box<dyn Future<Output = std::io::Result<TlsConn>> + Send>>
       + Send
       + Sync
       + 'static {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    move |tcp| {
        let accept = acceptor.accept(tcp);
        Box::pin(async move { accept.await.map(TlsConn) })
    }
}
