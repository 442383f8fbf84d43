//! `POST /reset` on the admin port: clears the counters of the descriptors in the body (the
//! `/json` request's shape: domain and descriptors) on every replica and in Redis
//! (`rls/reset.rs`), and answers what was cleared. It changes state, so it is refused (401,
//! `WWW-Authenticate: Bearer`) unless `ADMIN_TOKEN_FILE` names a token and the request
//! presents it as `Authorization: Bearer <token>`. Each reset is logged at info with who
//! asked: the peer's address and the token's fingerprint, never the token.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::admin_state::AdminState;
use super::admin_token::authorize;
use super::json;
use crate::rls::ResetError;

/// The most bytes of a `/reset` body: `/json`'s bound (axum's default body limit).
pub const MAX_RESET_BODY: usize = 2 * 1024 * 1024;

pub(super) async fn reset_handler(State(s): State<AdminState>, req: Request) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_string(), |c| c.0.to_string());
    let token = match authorize(s.admin_token.as_deref(), req.headers(), &peer, "reset") {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_RESET_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("bad request: {e} (at most {MAX_RESET_BODY} bytes)\n"),
            )
                .into_response()
        }
    };
    let rl = match json::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    match s.limiter.reset(&rl).await {
        Ok(cleared) => {
            let rules: Vec<&str> = cleared
                .descriptors
                .iter()
                .filter_map(|d| d.rule.as_deref())
                .collect();
            tracing::info!(
                %peer,
                token = %token.fingerprint(),
                domain = %cleared.domain,
                descriptors = cleared.descriptors.len(),
                rules = ?rules,
                "counters reset"
            );
            (StatusCode::OK, axum::Json(cleared)).into_response()
        }
        Err(ResetError::Request(e)) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
        Err(e) => {
            tracing::warn!(%peer, token = %token.fingerprint(), error = %e, "reset failed");
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}
