//! The HTTP face (port 8080): `/healthcheck`, `/livez`, `/readyz`, `POST /json`, `/metrics`,
//! `/rlconfig`, `/rlconfig/status`.
//!
//! `/json` takes a `RateLimitRequest` in proto3 JSON (camelCase or original field names,
//! numbers or strings for integers, enum names or numbers) and answers the `RateLimitResponse`
//! in proto3 JSON as protojson prints it (camelCase, enum names, durations as `"12s"`, default
//! values omitted), with status 429 when the overall code is `OVER_LIMIT`, as the reference does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

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
    let req: JsonRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    let req = match req.into_proto() {
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
            (status, axum::Json(response_json(&resp))).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

/// A proto3 JSON integer: a number or a decimal string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JsonInt {
    Num(u64),
    Str(String),
}

impl JsonInt {
    fn get(&self, field: &str) -> Result<u64, String> {
        match self {
            JsonInt::Num(n) => Ok(*n),
            JsonInt::Str(s) => s
                .parse()
                .map_err(|_| format!("{field}: '{s}' is not an unsigned integer")),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JsonEnum {
    Num(i32),
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<JsonInt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<JsonInt>,
    #[serde(default, rename = "isNegativeHits", alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, rename = "requestsPerUnit", alias = "requests_per_unit")]
    requests_per_unit: Option<JsonInt>,
    #[serde(default)]
    unit: Option<JsonEnum>,
}

impl JsonRequest {
    fn into_proto(self) -> Result<RateLimitRequest, String> {
        let u32_of = |v: &Option<JsonInt>, field: &str| -> Result<u32, String> {
            v.as_ref().map_or(Ok(0), |v| v.get(field)).and_then(|n| {
                u32::try_from(n).map_err(|_| format!("{field}: {n} does not fit in 32 bits"))
            })
        };
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for d in self.descriptors {
            let limit = match &d.limit {
                None => None,
                Some(o) => Some(RateLimitOverride {
                    requests_per_unit: u32_of(&o.requests_per_unit, "requestsPerUnit")?,
                    unit: match &o.unit {
                        None => 0,
                        Some(JsonEnum::Num(n)) => *n,
                        Some(JsonEnum::Name(n)) => PbUnit::from_str_name(n)
                            .ok_or_else(|| format!("unit: unknown unit '{n}'"))?
                            as i32,
                    },
                }),
            };
            let hits_addend = match &d.hits_addend {
                None => None,
                Some(h) => Some(envoy_types::pb::google::protobuf::UInt64Value {
                    value: h.get("hitsAddend")?,
                }),
            };
            descriptors.push(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend,
                is_negative_hits: d.is_negative_hits,
            });
        }
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: u32_of(&self.hits_addend, "hitsAddend")?,
        })
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A response in proto3 JSON, as protojson prints it (default values omitted).
pub fn response_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), code_name(r.overall_code).into());
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), code_name(s.code).into());
            if let Some(l) = &s.current_limit {
                let mut lm = Map::new();
                if !l.name.is_empty() {
                    lm.insert("name".into(), l.name.clone().into());
                }
                if l.requests_per_unit != 0 {
                    lm.insert("requestsPerUnit".into(), l.requests_per_unit.into());
                }
                lm.insert(
                    "unit".into(),
                    PbUnit::try_from(l.unit)
                        .map_or("UNKNOWN", |u| u.as_str_name())
                        .into(),
                );
                m.insert("currentLimit".into(), lm.into());
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), s.limit_remaining.into());
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    format!("{}s", d.seconds).into(),
                );
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), statuses.into());
    }
    if !r.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), headers.into());
    }
    Value::Object(out)
}
