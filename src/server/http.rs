//! The HTTP face (port 8080): `/healthcheck`, `/livez`, `/readyz`, `POST /json`, `/metrics`,
//! `/rlconfig`, `/rlconfig/status`.
//!
//! `/json` speaks proto3 JSON (`json.rs`) and answers 429 when the overall code is
//! `OVER_LIMIT`, as the reference does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::json;

use super::json;
use crate::rls::RateLimiter;
use crate::server::reload::ReloadStatus;
use crate::server::shutdown::Readiness;

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The limiter.
    pub limiter: Arc<RateLimiter>,
    /// Readiness latch.
    pub readiness: Arc<Readiness>,
    /// Rules load status.
    pub reload: Arc<ReloadStatus>,
    /// Global mode: each Redis shard's health (empty in local mode).
    pub shards: Vec<Arc<crate::global::ShardHealth>>,
}

/// The HTTP routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/livez", get(|| async { "OK" }))
        .route("/readyz", get(readyz))
        .route("/json", post(json_handler))
        .route("/metrics", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .route("/rlconfig/status", get(rlconfig_status))
        .with_state(state)
}

async fn healthcheck(State(s): State<AdminState>) -> Response {
    if s.readiness.is_ready() {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK").into_response()
    }
}

async fn readyz(State(s): State<AdminState>) -> Response {
    let rules = s.limiter.rules();
    let (_, errors, _) = s.reload.snapshot();
    let mut body = format!(
        "rules: {} from {} file(s)\n",
        rules.rules.rules().len(),
        rules.files.len()
    );
    if !errors.is_empty() {
        body.push_str(&format!(
            "last reload rejected ({} error(s)); previous rules in force\n",
            errors.len()
        ));
    }
    // A degraded shard is reported but does not make the service unready: decisions
    // continue from memory and the deltas are kept until Redis is back.
    for h in &s.shards {
        match h.last_error() {
            Some(e) if h.is_degraded() => {
                body.push_str(&format!("redis shard {}: degraded: {e}\n", h.name))
            }
            _ => body.push_str(&format!("redis shard {}: ok\n", h.name)),
        }
    }
    if s.readiness.is_ready() {
        (StatusCode::OK, format!("ready\n{body}")).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready\n{body}"),
        )
            .into_response()
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.limiter.telemetry().render(),
    )
        .into_response()
}

async fn rlconfig(State(s): State<AdminState>) -> String {
    s.limiter.rules().rules.dump()
}

async fn rlconfig_status(State(s): State<AdminState>) -> Response {
    let rules = s.limiter.rules();
    let (loads, errors, since) = s.reload.snapshot();
    axum::Json(json!({
        "loads": loads,
        "rules": rules.rules.rules().len(),
        "files": rules.files,
        "applied_at_unix_ms": rules.applied_at.0,
        "errors": errors,
        "errors_since_unix_ms": since.map(|t| t.0),
    }))
    .into_response()
}

async fn json_handler(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    let req = match json::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    match s.limiter.should_rate_limit(&req) {
        Ok(resp) => {
            let status = if resp.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(json::response_json(&resp))).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}
