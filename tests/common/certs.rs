//! Throwaway certificates for the TLS tests, made with the openssl CLI (a missing `openssl`
//! fails the test with an install hint): CAs, server and client leaves (ECDSA P-256, v3
//! extensions rustls/webpki accept). `tls_client.rs` makes rustls clients that use them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

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
