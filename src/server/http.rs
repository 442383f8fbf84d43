//! The HTTP face (port 8080): `/` (the status page), `/status.json`, `/healthcheck`, `/livez`,
//! `/readyz`, `POST /json`, `POST /explain`, `POST /reset`, `GET /top`, `/metrics`,
//! `/rlconfig`, `/rlconfig/status`.
//!
//! `/explain` takes `/json`'s body and answers what it would be answered, and why, counting
//! nothing (`rls/explain.rs`); always 200 when the body is valid, whatever the code.
//!
//! `POST /reset` (`reset.rs`) clears counters fleet-wide, behind the admin token; `GET /top`
//! (`top.rs`) lists the keys nearest their limits, behind it too unless `ADMIN_OPEN_READS`.
//!
//! `GET /` is the status page (`page.rs`, with `/page.js` and `/page.css`), which polls
//! `GET /status.json` (`status.rs`).
//!
//! `/json` speaks proto3 JSON (`json.rs`) and answers 429 when the overall code is
//! `OVER_LIMIT`, as the reference does. With `TRACING_ENABLED` its calls are spans too, from
//! the request's W3C or B3 headers.
//!
//! The connections themselves (caps and timeouts) are `http_conn.rs`'s; [`serve`] is
//! re-exported here.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::json;

pub use super::http_conn::{serve, HttpLimits};
use super::json;
use crate::telemetry::otel::Via;
use crate::telemetry::Telemetry;

pub use super::admin_state::AdminState;

/// The HTTP routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/", get(super::page::index))
        .route("/page.js", get(super::page::script))
        .route("/page.css", get(super::page::style))
        .route("/status.json", get(super::status::status_handler))
        .route("/healthcheck", get(healthcheck))
        .route("/livez", get(|| async { "OK" }))
        .route("/readyz", get(readyz))
        .route("/json", post(json_handler))
        .route("/explain", post(explain_handler))
        .route("/reset", post(super::reset::reset_handler))
        .route("/top", get(super::top::top_handler))
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
    // A degraded shard, or one that has not answered yet, is reported but does not make the
    // service unready: decisions continue from memory and the deltas are kept until Redis
    // answers. Only "ok" means the shard has answered and its last call succeeded.
    // A store that lost the sync's keys is noted too, and stays ready: the replicas restore
    // the counts from memory.
    for h in &s.shards {
        body.push_str(&format!("redis shard {}: {}", h.name, h.status()));
        if let Some(note) = h.resets_note() {
            body.push_str(&format!(" ({note})"));
        }
        body.push('\n');
    }
    // Whether the running replicas count this one yet, and what it knows of the fleet: a
    // replica that started while Redis did not answer says so here for as long as it runs.
    if let Some(fleet) = &s.fleet {
        body.push_str(&format!("{fleet}\n"));
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
        s.limiter
            .telemetry()
            .render_off_workers(Telemetry::render)
            .await,
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
        "version": env!("CARGO_PKG_VERSION"),
        "commit": crate::COMMIT,
        "loads": loads,
        "rules": rules.rules.rules().len(),
        "files": rules.files,
        "applied_at_unix_ms": rules.applied_at.0,
        "errors": errors,
        "errors_since_unix_ms": since.map(|t| t.0),
    }))
    .into_response()
}

/// The request headers a `/json` span is continued from: copied only when tracing is on, so
/// an untraced call costs nothing more (axum's `HeaderMap` extractor would clone them always).
struct TraceHeaders(Option<HeaderMap>);

impl axum::extract::FromRequestParts<AdminState> for TraceHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        Ok(TraceHeaders(
            state.tracer.as_ref().map(|_| parts.headers.clone()),
        ))
    }
}

async fn explain_handler(State(s): State<AdminState>, body: axum::body::Bytes) -> Response {
    let req = match json::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    match s.limiter.explain(&req).await {
        Ok(answer) => axum::Json(answer).into_response(),
        Err(e) if e.is_client_error() => {
            (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

async fn json_handler(
    State(s): State<AdminState>,
    TraceHeaders(headers): TraceHeaders,
    body: axum::body::Bytes,
) -> Response {
    let req = match json::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    let span = s
        .tracer
        .as_ref()
        .zip(headers.as_ref())
        .and_then(|(t, headers)| {
            t.start(
                Via::Http,
                |name| headers.get(name).and_then(|v| v.to_str().ok()),
                &req.domain,
                req.descriptors.len(),
            )
        });
    let (status, answer) = match s.limiter.should_rate_limit_async(&req).await {
        Ok(resp) => {
            let status = if resp.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            if let Some(span) = span {
                span.end(
                    i64::from(status.as_u16()),
                    Ok(super::grpc::overall_code(&resp)),
                );
            }
            return (status, axum::Json(json::response_json(&resp))).into_response();
        }
        Err(e) if e.is_client_error() => (StatusCode::BAD_REQUEST, format!("{e}\n")),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    };
    if let Some(span) = span {
        span.end(i64::from(status.as_u16()), Err(answer.trim_end()));
    }
    (status, answer).into_response()
}
