//! Throwaway certificates for the gRPC TLS tests, made with the openssl CLI (a missing
//! `openssl` fails the test with an install hint): CAs, server and client leaves (ECDSA P-256,
//! v3 extensions rustls/webpki accept), and rustls client configurations that use them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate and its key on disk.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let bin = super::require_tool("openssl", "apt-get install -y openssl");
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// A self-signed CA `name` (files `name.crt`, `name.key` in `dir`).
pub fn ca(dir: &Path, name: &str) -> Pair {
    let (cert, key) = (format!("{name}.crt"), format!("{name}.key"));
    let subj = format!("/CN={name}");
    let mut args = vec!["req", "-x509", "-new"];
    args.extend(EC);
    args.extend([
        "-keyout",
        &key,
        "-out",
        &cert,
        "-days",
        "7",
        "-subj",
        &subj,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &args);
    Pair {
        cert: dir.join(cert),
        key: dir.join(key),
    }
}

/// Distinct serials, so a rotated certificate is told from the old one.
static SERIAL: AtomicU64 = AtomicU64::new(1);

/// A leaf `name` signed by `ca`, for `usage` (`serverAuth` or `clientAuth`), with the SANs
/// `sans` (openssl syntax: `DNS:localhost,IP:127.0.0.1`).
pub fn leaf(dir: &Path, name: &str, ca: &Pair, usage: &str, sans: &str) -> Pair {
    let (cert, key, csr, ext) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
    );
    let subj = format!("/CN={name}");
    let mut args = vec!["req", "-new"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args);
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage={usage}\n\
             subjectAltName={sans}\n"
        ),
    )
    .unwrap();
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed).to_string();
    let (ca_cert, ca_key) = (ca.cert.to_str().unwrap(), ca.key.to_str().unwrap());
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca_cert,
            "-CAkey",
            ca_key,
            "-set_serial",
            &serial,
            "-out",
            &cert,
            "-days",
            "7",
            "-extfile",
            &ext,
        ],
    );
    Pair {
        cert: dir.join(cert),
        key: dir.join(key),
    }
}

/// A server leaf for `localhost` and 127.0.0.1.
pub fn server(dir: &Path, name: &str, ca: &Pair) -> Pair {
    leaf(dir, name, ca, "serverAuth", "DNS:localhost,IP:127.0.0.1")
}

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
