//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): the
//! protocol's semantics, independent of the transport, as `rls/` is for `ShouldRateLimit`.
//!
//! A bucket id (a `map<string, string>`) resolves to a rule through the same descriptor tree
//! and counts in the same counter as the equivalent descriptor: `RuleSet::find_bucket` in
//! `rules/`, and `RateLimiter::count_quota` in `rls/quota.rs`. Here, in the order a report
//! goes through them:
//! - `report.rs`: one `RateLimitQuotaUsageReports` checked against the protocol and the bounds,
//!   into typed per-bucket usage, or the `INVALID_ARGUMENT` message that names the problem.
//! - `stream.rs`: one Envoy stream: its buckets, each resolved and counted; what a report and
//!   the periodic refresh send back.
//! - `response.rs`: what a stream sends, encoded as it is made, and the bucket ids it keeps
//!   to send, each kept once as its encoding.
//! - `engine.rs`: what every stream shares (`Quotas`): each counter's sharers and their
//!   demand, the split of its room, the bounds; young streams' grants in `young.rs`, a short
//!   window's first ones held to its epoch's room.
//! - `metrics.rs`: the service's metrics, read from the engine's counters.
//! - `replace.rs`: when an assignment goes out again, and whether it replaces Envoy's running
//!   bucket.
//! - `share.rs`: the pure arithmetic of dividing one limit among the streams sharing a bucket:
//!   each stream's demand from its reports, its fraction of the fleet's room, and the
//!   assignment (token bucket or blanket rule, TTL) Envoy gets for it.
//! - `assignment.rs`: what a stream is sent for a bucket (strategy, TTL) and its encoding.
//! - `room.rs`: what a counter leaves the fleet: tokens at once, the rate and what comes
//!   back, and when the streams must be denied.
//! - `published.rs`: the engine as the fleet's presence exchange sees it (`global/presence/`).
//! - `config.rs`: the `RLQS_*` settings.
//!
//! Layers: `rlqs` uses the core, the rules (a bucket id's bounds), the limiter (`rls`),
//! `global`'s presence exchange and `telemetry`; the transport is `server/rlqs.rs`.

pub mod assignment;
pub mod config;
pub mod engine;
pub mod listing;
pub mod metrics;
pub mod published;
pub mod replace;
pub mod report;
pub mod response;
pub mod room;
pub mod share;
pub mod stream;

pub use config::{Config, UnknownBuckets};
pub use engine::{QuotaStats, Quotas};
pub use metrics::register_metrics;
pub use replace::{carried_tokens, hold, must_send, to_send, Pressure};
pub use report::{
    check, Counts, Report, ReportError, Usage, MAX_BUCKET_BYTES, MAX_TIME_ELAPSED,
    MAX_USAGES_PER_REPORT,
};
pub use response::Actions;
pub use share::{
    assign, assign_all, over_rate, split, strategy_proto, whole_secs, Assignment, Demand, Rest,
    Room, Strategy, MAX_FILL_INTERVAL_S,
};
pub use stream::{Refused, Stream, StreamError, REFRESH};
