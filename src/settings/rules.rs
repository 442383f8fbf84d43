//! Where the rules come from and how they are read: the rules path, whether domains merge,
//! the default algorithm, the reload debounce, and `CONFIG_TYPE` with the xDS management
//! server's variables.

use std::path::PathBuf;
use std::time::Duration;

use super::source::{
    at_least_one, boolean, duration, one_of, positive_duration, ValueError, Values,
};

use crate::core::Algorithm;
use crate::rules::CompileOptions;
use crate::server::tls;
use crate::sources::xds::{connect, XdsSettings, XdsTls};

/// Where the rules are, how they are read, and the reload debounce.
pub(super) fn files(v: &mut Values<'_>) -> (PathBuf, CompileOptions, Duration) {
    let config_path = match (v.raw("SLUICE_CONFIG"), v.raw("RUNTIME_ROOT")) {
        (Some(config), _) => PathBuf::from(config),
        (None, Some(root)) => PathBuf::from(root)
            .join(v.text("RUNTIME_SUBDIRECTORY"))
            .join(v.text("RUNTIME_APPDIRECTORY")),
        (None, None) => PathBuf::from("config/rules"),
    };
    let options = CompileOptions {
        merge_domains: v.or("MERGE_DOMAIN_CONFIG", false, boolean),
        default_algorithm: match v.or(
            "DEFAULT_ALGORITHM",
            "sliding_window",
            one_of(&["sliding_window", "fixed_window"]),
        ) {
            "fixed_window" => Algorithm::FixedWindow,
            _ => Algorithm::SlidingWindow,
        },
    };
    let debounce = v.or("RELOAD_DEBOUNCE", Duration::ZERO, duration);
    (config_path, options, debounce)
}

/// `CONFIG_TYPE` and, for `GRPC_XDS_SOTW`, how to reach the management server. The xDS
/// variables are parsed whatever the type (a bad value is an error either way, as in the
/// reference); the server's URL and TLS files are checked only when they will be used.
pub(super) fn xds(v: &mut Values<'_>, warnings: &mut Vec<String>) -> Option<XdsSettings> {
    let on = v.or("CONFIG_TYPE", "FILE", one_of(&["FILE", "GRPC_XDS_SOTW"])) == "GRPC_XDS_SOTW";
    let force_start = v.or("FORCE_START_WITHOUT_INITIAL_CONFIG", false, boolean);
    let need_a_domain = v.or("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false, boolean);
    let server_url = v.text("CONFIG_GRPC_XDS_SERVER_URL").trim().to_string();
    let node_id = v.text("CONFIG_GRPC_XDS_NODE_ID");
    let node_metadata = node_metadata(&v.text("CONFIG_GRPC_XDS_NODE_METADATA"), warnings);
    let headers = v
        .parse("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", headers)
        .unwrap_or_default();
    let retry_interval = v.or(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        Duration::ZERO,
        positive_duration,
    );
    let retry_max = v.or(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        Duration::ZERO,
        positive_duration,
    );
    let max_message_bytes = v.parse("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", at_least_one);
    let tls = xds_tls(v, on);
    if !on {
        return None;
    }
    if connect::endpoint(&server_url).is_err() {
        v.error(
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("'{server_url}' is not host:port"),
        );
    }
    Some(XdsSettings {
        server_url,
        node_id,
        node_metadata,
        headers,
        retry_interval,
        retry_max,
        max_message_bytes,
        tls,
        force_start,
        need_a_domain,
    })
}

/// `CONFIG_GRPC_XDS_NODE_METADATA`: `key=value` pairs separated by commas. A pair without `=`
/// is dropped with a warning, as the reference drops it (silently).
pub(super) fn node_metadata(raw: &str, warnings: &mut Vec<String>) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for entry in raw.split(',').filter(|e| !e.trim().is_empty()) {
        match entry.split_once('=') {
            Some((k, val)) => pairs.push((k.to_string(), val.to_string())),
            None => warnings.push(format!(
                "CONFIG_GRPC_XDS_NODE_METADATA: '{entry}' is not key=value and is not sent"
            )),
        }
    }
    pairs
}

/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: `name:value` pairs separated by commas (the
/// reference's map syntax). Names are lowercased, as gRPC metadata keys are.
pub(super) fn headers(raw: &str) -> Result<Vec<(String, String)>, ValueError> {
    let mut headers = Vec::new();
    for entry in raw.split(',').filter(|e| !e.trim().is_empty()) {
        let Some((name, value)) = entry.split_once(':') else {
            return Err(ValueError::NotNameValue);
        };
        let name = name.trim().to_ascii_lowercase();
        let valid_name =
            tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(name.as_bytes())
                .is_ok();
        let valid_value = value.parse::<tonic::metadata::AsciiMetadataValue>().is_ok();
        if !valid_name || name.ends_with("-bin") {
            return Err(ValueError::BadHeaderName(name));
        }
        if !valid_value {
            return Err(ValueError::BadHeaderValue(name));
        }
        headers.push((name, value.to_string()));
    }
    Ok(headers)
}

/// `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files, read once here when xDS is `on` so that a
/// bad one stops the start naming it.
pub(super) fn xds_tls(v: &mut Values<'_>, on: bool) -> Option<XdsTls> {
    let use_tls = v.or("CONFIG_GRPC_XDS_SERVER_USE_TLS", false, boolean);
    let path = |v: &Values<'_>, name| v.raw(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    let tls = XdsTls {
        client_cert: path(v, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
        client_key: path(v, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        server_ca: path(v, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
        server_san: v
            .raw("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
            .filter(|s| !s.is_empty()),
    };
    if !on || !use_tls {
        return None;
    }
    if tls.client_cert.is_some() != tls.client_key.is_some() {
        v.error(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together: set both or neither",
        );
        return None;
    }
    if let Err(e) = connect::client_config(&tls) {
        let setting = match &e {
            tls::TlsError::File { path, .. } if Some(path) == tls.client_key.as_ref() => {
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"
            }
            tls::TlsError::File { path, .. } if Some(path) == tls.server_ca.as_ref() => {
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"
            }
            _ => "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        };
        v.error(setting, e.to_string());
    }
    if let Some(san) = &tls.server_san {
        if let Err(e) = tls::parse_san(san) {
            v.error("CONFIG_GRPC_XDS_SERVER_TLS_SAN", e.to_string());
        }
    }
    Some(tls)
}
