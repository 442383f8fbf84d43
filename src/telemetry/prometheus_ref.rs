//! `USE_PROMETHEUS`: the reference's metrics as its Prometheus mapping names them, on a
//! listener of their own (`PROMETHEUS_ADDR`, `PROMETHEUS_PATH`), so dashboards and alerts
//! written for envoyproxy/ratelimit keep working. sluice's own `/metrics` stays on the HTTP
//! port. The reference maps `ratelimit.service.rate_limit.<domain>.<key1>[.<key2>].<counter>`
//! to `ratelimit_service_rate_limit_<counter>{domain, key1[, key2]}`; a deeper key path keeps
//! the rest of it in `key2`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::routing::get;
use axum::Router;

use crate::telemetry::{label_value as escape, Telemetry, RULE_COUNTERS};

/// Where the reference's metrics are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// `PROMETHEUS_ADDR` (`:9090` listens on every address).
    pub addr: std::net::SocketAddr,
    /// `PROMETHEUS_PATH`.
    pub path: String,
}

/// The router serving the text exposition at `path`.
pub fn router(path: &str, telemetry: Arc<Telemetry>) -> Router {
    Router::new().route(
        path,
        get(move || {
            let t = telemetry.clone();
            async move {
                let text = t.render_off_workers(render).await;
                ([("content-type", "text/plain; version=0.0.4")], text)
            }
        }),
    )
}

/// The exposition text: the per-rule counters and the request count.
pub fn render(telemetry: &Telemetry) -> String {
    let rules = telemetry.rules.snapshot();
    let mut out = String::new();
    for (counter, _, pick) in RULE_COUNTERS {
        let name = format!("ratelimit_service_rate_limit_{counter}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for ((domain, key), stats) in &rules {
            let path = key.strip_prefix(&format!("{domain}.")).unwrap_or(key);
            let mut labels = format!("domain=\"{}\"", escape(domain));
            match path.split_once('.') {
                Some((k1, k2)) => {
                    let _ = write!(labels, ",key1=\"{}\",key2=\"{}\"", escape(k1), escape(k2));
                }
                None => {
                    let _ = write!(labels, ",key1=\"{}\"", escape(path));
                }
            }
            let _ = writeln!(out, "{name}{{{labels}}} {}", pick(stats));
        }
    }
    for (name, count) in [
        (
            "config_load_success",
            &telemetry.service.config_load_success,
        ),
        ("config_load_error", &telemetry.service.config_load_error),
    ] {
        let _ = writeln!(out, "# TYPE ratelimit_service_{name} counter");
        let _ = writeln!(
            out,
            "ratelimit_service_{name} {}",
            count.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(out, "# TYPE ratelimit_service_total_requests counter");
    let _ = writeln!(
        out,
        "ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {}",
        telemetry.service.requests.load(Ordering::Relaxed)
    );
    let svc = &telemetry.service;
    let _ = writeln!(
        out,
        "# TYPE ratelimit_service_should_rate_limit_error counter"
    );
    for (err_type, count) in [
        ("service_error", &svc.invalid_requests),
        ("redis_error", &svc.redis_errors),
    ] {
        let _ = writeln!(
            out,
            "ratelimit_service_should_rate_limit_error{{err_type=\"{err_type}\"}} {}",
            count.load(Ordering::Relaxed)
        );
    }
    svc.response_time.write_prometheus(
        &mut out,
        "ratelimit_service_response_time_seconds",
        "ShouldRateLimit response time",
        "grpc_method=\"ShouldRateLimit\"",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::RuleStats;

    #[test]
    fn key_paths_become_the_references_labels() {
        let t = Telemetry::new().unwrap();
        RuleStats::add(&t.rules.get("d", "d.k_v").total_hits, 3);
        RuleStats::add(&t.rules.get("d", "d.a_b.c").over_limit, 2);
        RuleStats::add(&t.rules.get("d", "d.x.y.z").within_limit, 1);
        let text = render(&t);
        for line in [
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"k_v\"} 3",
            "ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"a_b\",key2=\"c\"} 2",
            "ratelimit_service_rate_limit_within_limit{domain=\"d\",key1=\"x\",key2=\"y.z\"} 1",
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 0",
            "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"} 0",
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.0001\"} 0",
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
