//! TLS-only servers: a throwaway CA, a server certificate (and a client one for mTLS) made
//! with the openssl CLI, and `RedisTls` holding the server with those files.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::require;
use super::server::{RedisServer, TlsFiles};

/// A TLS-only redis-server (`--port 0 --tls-port P`) with a throwaway CA and a server
/// certificate for 127.0.0.1 / localhost. Clients need no certificate (`--tls-auth-clients no`)
/// unless started with `start_mtls`.
pub struct RedisTls {
    pub server: RedisServer,
    /// PEM file of the CA that signed the server certificate; trust it in clients.
    pub ca_cert: PathBuf,
    /// With `start_mtls`: PEM files of a client certificate the CA signed, and its key.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl RedisTls {
    pub fn start() -> RedisTls {
        Self::start_with(&[])
    }

    /// Like `start`, with extra redis-server arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(args: &[&str]) -> RedisTls {
        Self::start_full(false, args)
    }

    /// A server that requires a client certificate signed by its CA (`--tls-auth-clients
    /// yes`); `client` holds one, which `cli` presents.
    pub fn start_mtls(args: &[&str]) -> RedisTls {
        Self::start_full(true, args)
    }

    /// Like `start`, the server certificate naming only `san` (openssl's subjectAltName form,
    /// e.g. `DNS:redis.invalid`), not the address clients dial.
    pub fn start_named(san: &str) -> RedisTls {
        Self::start_full_for(false, &[], san)
    }

    fn start_full(mtls: bool, args: &[&str]) -> RedisTls {
        Self::start_full_for(mtls, args, "IP:127.0.0.1,DNS:localhost")
    }

    fn start_full_for(mtls: bool, args: &[&str], san: &str) -> RedisTls {
        let dir = tempfile::Builder::new()
            .prefix("sluice-redis-tls-")
            .tempdir()
            .expect("create tempdir for redis-server");
        let mut files = make_tls_files_for(dir.path(), san);
        if mtls {
            files.client = Some(make_client_cert(dir.path()));
        }
        let ca_cert = files.ca_cert.clone();
        let client = files.client.clone();
        let server = RedisServer::start_in(
            dir,
            Some(files),
            args.iter().map(|s| s.to_string()).collect(),
        );
        RedisTls {
            server,
            ca_cert,
            client,
        }
    }

    /// `rediss://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// redis-cli over TLS; see `RedisServer::cli`.
    pub fn cli(&self, args: &[&str]) -> String {
        self.server.cli(args)
    }
}

/// Generates ca.crt/ca.key and server.crt/server.key (ECDSA P-256, v3 extensions that strict
/// verifiers such as rustls/webpki accept) in `dir` with the openssl CLI.
pub(super) fn make_tls_files(dir: &Path) -> TlsFiles {
    make_tls_files_for(dir, "IP:127.0.0.1,DNS:localhost")
}

/// Like `make_tls_files`, the server certificate naming `san` (openssl's subjectAltName form).
fn make_tls_files_for(dir: &Path, san: &str) -> TlsFiles {
    let openssl = Openssl {
        bin: require("openssl"),
        dir,
    };
    make_ca(&openssl);
    make_server_csr(&openssl);
    sign_server_cert(&openssl, san);
    TlsFiles {
        ca_cert: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        client: None,
    }
}

/// The openssl CLI, run in the directory the files go to.
struct Openssl<'a> {
    bin: PathBuf,
    dir: &'a Path,
}

impl Openssl<'_> {
    /// Runs openssl with `args`; panics with its output if it fails.
    fn run(&self, args: &[&str]) {
        let out = Command::new(&self.bin)
            .args(args)
            .current_dir(self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run openssl: {e}"));
        if !out.status.success() {
            panic!(
                "openssl {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A new ECDSA P-256 key, unencrypted (`req -newkey`).
const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// ca.crt/ca.key: a self-signed CA that may sign certificates.
fn make_ca(openssl: &Openssl) {
    let mut ca = vec!["req", "-x509", "-new"];
    ca.extend(EC_KEY);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "7",
        "-subj",
        "/CN=sluice test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl.run(&ca);
}

/// server.key and the request for its certificate, server.csr.
fn make_server_csr(openssl: &Openssl) {
    let mut csr = vec!["req", "-new"];
    csr.extend(EC_KEY);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl.run(&csr);
}

/// server.crt: server.csr signed by the CA, with the v3 extensions (in server.ext) that
/// strict verifiers accept and `san` as its subjectAltName.
fn sign_server_cert(openssl: &Openssl, san: &str) {
    std::fs::write(
        openssl.dir.join("server.ext"),
        format!(
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName={san}\n"
        ),
    )
    .expect("write server.ext");
    let serial = format!("0x{:x}", RandomState::new().build_hasher().finish() >> 1);
    openssl.run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-set_serial",
        &serial,
        "-out",
        "server.crt",
        "-days",
        "7",
        "-extfile",
        "server.ext",
    ]);
}

/// A client certificate (clientAuth) signed by the CA `make_tls_files` left in `dir`:
/// `client.crt` and `client.key`.
pub(super) fn make_client_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = super::super::certs::Pair {
        cert: dir.join("ca.crt"),
        key: dir.join("ca.key"),
    };
    let p = super::super::certs::leaf(dir, "client", &ca, "clientAuth", "DNS:sluice-test-client");
    (p.cert, p.key)
}
