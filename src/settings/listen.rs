//! The listeners: `GRPC_*` and `HTTP_*` addresses, the gRPC port's TLS and bounds, and the
//! HTTP server's bounds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::source::{at_least_one, boolean, number, positive_duration, ValueError, Values};

use crate::server::grpc_conn::GrpcLimits;
use crate::server::tls::{self, GrpcTls};

/// The listeners and the HTTP server's bounds.
pub(super) struct Listeners {
    pub(super) grpc: Option<SocketAddr>,
    pub(super) grpc_limits: GrpcLimits,
    pub(super) http: Option<SocketAddr>,
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) max_connections: usize,
}

/// `GRPC_ADDR` or `GRPC_HOST`+`GRPC_PORT`, the same for HTTP, and the HTTP server's bounds.
pub(super) fn listeners(v: &mut Values<'_>) -> Listeners {
    let grpc = address(
        v,
        "GRPC_ADDR",
        "GRPC_HOST",
        "GRPC_PORT",
        "GRPC_HOST/GRPC_PORT",
    );
    let http = address(v, "HTTP_ADDR", "HOST", "PORT", "HOST/PORT");
    let grpc_limits = GrpcLimits {
        max_connections: v.or("GRPC_MAX_CONNECTIONS", 1, at_least_one),
        max_concurrent_streams: v.or("GRPC_MAX_CONCURRENT_STREAMS", 1, at_least_one),
        max_concurrent_requests: v.or("GRPC_MAX_CONCURRENT_REQUESTS", 1, at_least_one),
        request_timeout: v.or("GRPC_REQUEST_TIMEOUT", Duration::ZERO, positive_duration),
        handshake_timeout: v.or("GRPC_HANDSHAKE_TIMEOUT", Duration::ZERO, positive_duration),
        idle_timeout: v.or("GRPC_IDLE_TIMEOUT", Duration::ZERO, positive_duration),
    };
    Listeners {
        grpc,
        grpc_limits,
        http,
        header_read_timeout: v.or(
            "HTTP_HEADER_READ_TIMEOUT",
            Duration::ZERO,
            positive_duration,
        ),
        idle_timeout: v.or("HTTP_IDLE_TIMEOUT", Duration::ZERO, positive_duration),
        max_connections: v.or("HTTP_MAX_CONNECTIONS", 1, at_least_one),
    }
}

/// `GRPC_SERVER_USE_TLS` and its files. Each file is loaded once here, so a missing or bad
/// one stops the start with its name rather than failing every handshake later.
pub(super) fn grpc_tls(v: &mut Values<'_>) -> Option<GrpcTls> {
    let on = v.or("GRPC_SERVER_USE_TLS", false, boolean);
    let path = |v: &Values<'_>, name| v.raw(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    let cert = path(v, "GRPC_SERVER_TLS_CERT");
    let key = path(v, "GRPC_SERVER_TLS_KEY");
    let client_ca = path(v, "GRPC_CLIENT_TLS_CACERT");
    let client_san = v.raw("GRPC_CLIENT_TLS_SAN").filter(|s| !s.is_empty());
    if !on {
        // Client verification without TLS would silently be none at all.
        if client_ca.is_some() || client_san.is_some() {
            v.error(
                "GRPC_SERVER_USE_TLS",
                "GRPC_CLIENT_TLS_CACERT/GRPC_CLIENT_TLS_SAN need GRPC_SERVER_USE_TLS=true",
            );
        }
        return None;
    }
    if cert.is_none() {
        v.error(
            "GRPC_SERVER_TLS_CERT",
            "is required when GRPC_SERVER_USE_TLS is true",
        );
    }
    if key.is_none() {
        v.error(
            "GRPC_SERVER_TLS_KEY",
            "is required when GRPC_SERVER_USE_TLS is true",
        );
    }
    if let (Some(cert), Some(key)) = (&cert, &key) {
        if let Err(e) = tls::load_certified_key(cert, key) {
            let setting = match &e {
                tls::TlsError::File { path, .. } if path == key => "GRPC_SERVER_TLS_KEY",
                _ => "GRPC_SERVER_TLS_CERT",
            };
            v.error(setting, e.to_string());
        }
    }
    if let Some(ca) = &client_ca {
        if let Err(e) = tls::load_roots(ca) {
            v.error("GRPC_CLIENT_TLS_CACERT", e.to_string());
        }
    }
    if let Some(san) = &client_san {
        if client_ca.is_none() {
            v.error(
                "GRPC_CLIENT_TLS_SAN",
                "needs GRPC_CLIENT_TLS_CACERT: without client verification there is no certificate to check",
            );
        }
        if let Err(e) = tls::parse_san(san) {
            v.error("GRPC_CLIENT_TLS_SAN", e.to_string());
        }
    }
    Some(GrpcTls {
        cert: cert?,
        key: key?,
        client_ca,
        client_san,
    })
}

/// One listen address: `explicit` when set, else `host`:`port` (IPv6 hosts bracketed).
pub(super) fn address(
    v: &mut Values<'_>,
    explicit: &'static str,
    host: &'static str,
    port: &'static str,
    pair: &'static str,
) -> Option<SocketAddr> {
    let port: Option<u16> = v.parse(port, number);
    let explicit = v.raw(explicit).is_some().then(|| {
        v.parse(explicit, |s| {
            s.parse::<SocketAddr>()
                .map_err(|_| ValueError::NotIpAndPort)
        })
    });
    if let Some(addr) = explicit {
        return addr;
    }
    let host = v.text(host);
    let s = if host.contains(':') {
        format!("[{host}]:{}", port?)
    } else {
        format!("{host}:{}", port?)
    };
    s.parse()
        .map_err(|_| v.error(pair, format!("'{s}' is not an IP address and port")))
        .ok()
}
