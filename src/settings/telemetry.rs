//! Metrics, traces and logs: the reference's Prometheus and statsd exporters, OTLP,
//! `METRICS_MAX_KEY_BYTES`'s bound and `LOG_LEVEL`.

use std::net::SocketAddr;
use std::time::Duration;

use super::source::{boolean, number, one_of, positive_duration, ValueError, Values};

use crate::telemetry::otel::{Endpoints, OtlpSettings, Protocol};
use crate::telemetry::prometheus_ref::PrometheusSettings;
use crate::telemetry::statsd::StatsdSettings;
use crate::telemetry::MIN_KEY_BYTES;

/// `USE_PROMETHEUS` with `PROMETHEUS_ADDR` (`:9090`: every address) and `PROMETHEUS_PATH`.
pub(super) fn prometheus(v: &mut Values<'_>) -> Option<PrometheusSettings> {
    let on = v.or("USE_PROMETHEUS", false, boolean);
    let addr = v.parse("PROMETHEUS_ADDR", |s| {
        let full = if s.starts_with(':') {
            format!("0.0.0.0{s}")
        } else {
            s.to_string()
        };
        full.parse::<SocketAddr>()
            .map_err(|_| ValueError::NotAddress)
    })?;
    let path = v.text("PROMETHEUS_PATH");
    if !path.starts_with('/') {
        v.error("PROMETHEUS_PATH", format!("'{path}' does not start with /"));
        return None;
    }
    on.then_some(PrometheusSettings { addr, path })
}

/// `TRACING_*`, the OTLP endpoints and `OTEL_METRICS_EXPORTER`.
pub(super) fn otlp(v: &mut Values<'_>) -> OtlpSettings {
    let tracing = v.or("TRACING_ENABLED", false, boolean);
    let protocol = match v.or(
        "TRACING_EXPORTER_PROTOCOL",
        "http",
        one_of(&["http", "grpc"]),
    ) {
        "grpc" => Protocol::Grpc,
        _ => Protocol::Http,
    };
    // The reference takes any number: at or above 1 every root is traced, at or below 0 none.
    let sampling_rate = v.or("TRACING_SAMPLING_RATE", 1.0, |s| match s.parse::<f64>() {
        Ok(r) if r.is_finite() => Ok(r.clamp(0.0, 1.0)),
        _ => Err(ValueError::NotRate),
    });
    let endpoint = |v: &mut Values<'_>, name| v.parse(name, otlp_endpoint);
    let endpoints = Endpoints {
        common: endpoint(v, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        traces: endpoint(v, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        metrics: endpoint(v, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
    };
    // The specification's list (otlp, prometheus, console, none); /metrics is always served.
    let exporters = v.or("OTEL_METRICS_EXPORTER", Vec::new(), |s| {
        s.split(',')
            .map(|e| one_of(&["otlp", "prometheus", "none"])(e.trim()))
            .collect::<Result<Vec<_>, _>>()
    });
    let metrics = exporters.contains(&"otlp") || endpoints.metrics.is_some();
    let instance = v.text("TRACING_SERVICE_INSTANCE_ID");
    OtlpSettings {
        tracing,
        protocol,
        endpoints,
        service_name: v.text("TRACING_SERVICE_NAME"),
        service_namespace: v.text("TRACING_SERVICE_NAMESPACE"),
        service_instance_id: (!instance.is_empty()).then_some(instance),
        sampling_rate,
        metrics,
    }
}

/// An OTLP endpoint: a plain `http://` URL (the exporters carry no TLS stack of their own).
pub(super) fn otlp_endpoint(s: &str) -> Result<String, ValueError> {
    if s.starts_with("https://") {
        return Err(ValueError::OtlpTls);
    }
    match s.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() => Ok(s.to_string()),
        _ => Err(ValueError::NotHttpUrl),
    }
}

/// `USE_STATSD` with `STATSD_HOST`, `STATSD_PORT` and `STATS_FLUSH_INTERVAL`.
pub(super) fn statsd(v: &mut Values<'_>) -> Option<StatsdSettings> {
    let on = v.or("USE_STATSD", false, boolean);
    let host = v.text("STATSD_HOST");
    let port: Option<u16> = v.parse("STATSD_PORT", number);
    let flush = v.or("STATS_FLUSH_INTERVAL", Duration::ZERO, positive_duration);
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{}", port?)
    } else {
        format!("{host}:{}", port?)
    };
    on.then_some(StatsdSettings { addr, flush })
}

/// `METRICS_MAX_KEY_BYTES`: room for a key's start and the hash that keeps it distinct.
pub(super) fn at_least_key_bytes(s: &str) -> Result<usize, ValueError> {
    match number::<usize>(s)? {
        n if n < MIN_KEY_BYTES => Err(ValueError::BelowLeast(MIN_KEY_BYTES)),
        n => Ok(n),
    }
}

/// `LOG_LEVEL`: a level (the reference's logrus names included) or, with `=` or `,`, an
/// env-filter directive. Checked here because a typo would otherwise log nothing useful: a bare
/// unknown word is a valid env-filter *target*.
pub(super) fn log_level(s: &str) -> Result<String, ValueError> {
    let lower = s.to_ascii_lowercase();
    if lower.contains('=') || lower.contains(',') {
        return tracing_subscriber::EnvFilter::try_new(&lower)
            .map(|_| lower.clone())
            .map_err(|e| ValueError::NotFilter(e.to_string()));
    }
    Ok(match lower.as_str() {
        "trace" | "debug" | "info" | "warn" | "error" | "off" => lower,
        "warning" => "warn".into(),
        "panic" | "fatal" => "error".into(),
        _ => {
            return Err(ValueError::NotOneOf(&[
                "trace", "debug", "info", "warn", "error", "off",
            ]))
        }
    })
}
