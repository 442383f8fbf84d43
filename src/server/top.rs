//! `GET /top?domain=D&rule=R&n=N` on the admin port: the keys nearest their limits now
//! (`rls/top.rs`), as JSON. Descriptor values are often secrets or personal data, so it
//! answers only a request that presents the admin token (`admin_token.rs`, as `/reset`
//! does), unless `ADMIN_OPEN_READS` opens it. Bounded: the query string's length
//! ([`MAX_TOP_QUERY_BYTES`]), `n` (at most [`MAX_TOP`]) and the candidates an answer reads
//! (`TOP_READ_BUDGET`).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::admin_state::AdminState;
use super::admin_token::authorize;
use crate::rls::{TopQuery, MAX_TOP};

/// The longest query string `/top` reads: a domain and a rule path of a few kilobytes.
pub const MAX_TOP_QUERY_BYTES: usize = 8192;

/// `n` when the query has none.
const DEFAULT_N: usize = 10;

/// The query's `domain`, `rule` and `n` (unknown parameters ignored), or why it is refused.
fn parse(query: &str) -> Result<(Option<String>, Option<String>, usize), String> {
    if query.len() > MAX_TOP_QUERY_BYTES {
        return Err(format!(
            "the query string is {} bytes (at most {MAX_TOP_QUERY_BYTES})",
            query.len()
        ));
    }
    let (mut domain, mut rule, mut n) = (None, None, DEFAULT_N);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "domain" => domain = Some(v.into_owned()),
            "rule" => rule = Some(v.into_owned()),
            "n" => {
                n = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_TOP).contains(n))
                    .ok_or_else(|| {
                        format!("n must be a whole number from 1 to {MAX_TOP} (got {v:?})")
                    })?;
            }
            _ => {}
        }
    }
    Ok((domain, rule, n))
}

pub(super) async fn top_handler(State(s): State<AdminState>, req: Request) -> Response {
    if !s.open_reads {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "unknown".to_string(), |c| c.0.to_string());
        if let Err(refused) = authorize(s.admin_token.as_deref(), req.headers(), &peer, "top") {
            return refused.into_response();
        }
    }
    let (domain, rule, n) = match parse(req.uri().query().unwrap_or_default()) {
        Ok(q) => q,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    // Up to TOP_READ_BUDGET lookups: off the runtime's workers, as a `/metrics` render is.
    let limiter = s.limiter.clone();
    let top = tokio::task::spawn_blocking(move || {
        limiter.top(TopQuery {
            domain: domain.as_deref(),
            rule: rule.as_deref(),
            n,
        })
    })
    .await;
    match top {
        Ok(top) => (StatusCode::OK, axum::Json(top)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_read_and_bounded() {
        assert_eq!(parse(""), Ok((None, None, 10)));
        assert_eq!(
            parse("domain=d%20x&rule=d.user&n=1000&other=1"),
            Ok((Some("d x".into()), Some("d.user".into()), 1000))
        );
        for bad in ["n=0", "n=1001", "n=-1", "n=ten", "n="] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("from 1 to 1000"), "{bad}: {e}");
        }
        let long = format!("domain={}", "x".repeat(MAX_TOP_QUERY_BYTES));
        assert!(parse(&long).unwrap_err().contains("at most 8192"));
    }
}
