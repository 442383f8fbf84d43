//! TLS material read from files: PEM certificate chains, private keys and CA bundles, and
//! SAN names, with the one crypto provider compiled in. Shared by the gRPC listener's TLS
//! (`server/tls.rs`, which re-exports these), the xDS client (`sources/xds/connect.rs`) and
//! the settings' checks at start, so none of them reaches into another for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// Why a TLS file or configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM of the expected kind.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key does not belong to the certificate, or rustls rejects the pair.
    #[error("{} with {}: {source}", cert.display(), key.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// The client SAN is neither a DNS name nor an IP address.
    #[error("'{0}' is not a DNS name or IP address")]
    San(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    // Explicit rather than the process default: none is installed, and `ring` is the only
    // provider compiled in.
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain (at least one certificate).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, e))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("invalid PEM ({e})")))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// Reads a PEM private key.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, e))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| file_error(path, format!("holds no usable PEM private key ({e})")))
}

/// Reads the certificate chain and key and checks that they belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert)?;
    let der = load_private_key(key)?;
    CertifiedKey::from_der(chain, der, &provider()).map_err(|source| TlsError::Pair {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    })
}

/// Reads a CA bundle into a root store.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(path, format!("not a usable CA certificate ({e})")))?;
    }
    Ok(roots)
}

/// Parses a client SAN.
pub fn parse_san(san: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(san.to_string()).map_err(|_| TlsError::San(san.to_string()))
}
