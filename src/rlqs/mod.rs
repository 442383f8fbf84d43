//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): the
//! protocol's semantics, independent of the transport, as `rls/` is for `ShouldRateLimit`.
//!
//! A bucket id (a `map<string, string>`) resolves to a rule through the same descriptor tree
//! and counts in the same counter as the equivalent descriptor: `RuleSet::find_bucket` in
//! `rules/`. So far this module holds the first step of a stream's message:
//! - `report.rs`: one `RateLimitQuotaUsageReports` checked against the protocol and the bounds,
//!   into typed per-bucket usage, or the `INVALID_ARGUMENT` message that names the problem.
//! - `share.rs`: the pure arithmetic of dividing one limit among the streams sharing a bucket:
//!   each stream's demand from its reports, its fraction of the fleet's room, and the
//!   assignment (token bucket or blanket rule, TTL) Envoy gets for it.
//!
//! Layers: `rlqs` uses the core (`core`, `rules`) and `telemetry` only, never the I/O edges.

pub mod config;
pub mod engine;
pub mod report;
pub mod share;
pub mod stream;

pub use config::{Config, UnknownBuckets};
pub use engine::{register_metrics, QuotaStats, Quotas};
pub use report::{
    check, Counts, Report, ReportError, Usage, MAX_BUCKET_BYTES, MAX_TIME_ELAPSED,
    MAX_USAGES_PER_REPORT,
};
pub use share::{
    assign, assign_all, carried_tokens, must_send, split, strategy_proto, whole_secs, Assignment,
    Demand, Rest, Room, Strategy, MAX_FILL_INTERVAL_S,
};
pub use stream::{Stream, StreamError, REFRESH};
