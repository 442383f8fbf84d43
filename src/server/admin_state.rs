//! What the HTTP handlers share ([`AdminState`]): apart from `http.rs`, which routes to the
//! handlers, so the handlers (`reset.rs`, `status.rs`, `top.rs`) need not name it back.

use std::sync::Arc;

use super::admin_token::AdminToken;
use crate::rls::RateLimiter;
use crate::server::shutdown::Readiness;
use crate::sources::ReloadStatus;
use crate::telemetry::otel::Tracer;

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
    /// Global mode: the replica's join of the fleet and the live count.
    pub fleet: Option<crate::global::Joining>,
    /// `TRACING_ENABLED`: the tracer of `/json` calls.
    pub tracer: Option<Arc<Tracer>>,
    /// `ADMIN_TOKEN_FILE`: what `POST /reset` and `GET /top` require; `None` refuses them.
    pub admin_token: Option<Arc<AdminToken>>,
    /// `ADMIN_OPEN_READS`: the admin reads that show descriptor values (`/top`) answer
    /// without the token; the status page is told so.
    pub open_reads: bool,
    /// The quota service, when it is on: its streams and buckets for `/status.json`.
    pub quotas: Option<Arc<crate::rlqs::Quotas>>,
    /// `/status.json`'s rules' sources, kept per rule set.
    pub status_sources: Arc<super::rule_sources::Sources>,
}
