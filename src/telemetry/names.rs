//! Every metric sluice exports on `/metrics` (and over OTLP): its name, help and kind, in one
//! table. The sites that register a metric name it by its constant here, never by a string,
//! so a name or a help text is written once; docs/operations.md lists them and tests scrape
//! them, so they change only with a note in the CHANGELOG.
//!
//! The reference's own names are the exporters' (`statsd.rs`, `prometheus_ref.rs`): they
//! follow envoyproxy/ratelimit's mapping of its statsd names, not this table.

use std::sync::atomic::Ordering;

use super::rules::ReadCounter;

/// What a metric is, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, a sum and a count.
    Histogram,
}

/// One metric: its name, its `# HELP` text and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The exported name.
    pub name: &'static str,
    /// The `# HELP` text (the OpenTelemetry description).
    pub help: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
}

const fn counter(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        help,
        kind: Kind::Counter,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        help,
        kind: Kind::Gauge,
    }
}

// The service (registered by `Telemetry` itself).
#[rustfmt::skip]
mod service {
    use super::{counter, gauge, Kind, Metric};
    pub const REQUESTS: Metric = counter("sluice_requests_total", "ShouldRateLimit calls answered");
    pub const REQUEST_ERRORS: Metric = counter("sluice_request_errors_total", "Requests refused, by reason");
    pub const DECISIONS: Metric = counter("sluice_decisions_total", "Descriptor decisions, by outcome");
    pub const CACHE: Metric = counter("sluice_cache_total", "Entity cache lookups, by result");
    pub const CONFIG_LOADS: Metric = counter("sluice_config_load_total", "Rules loads, by result");
    pub const BUILD_INFO: Metric = gauge("sluice_build_info", "Always 1, labelled with the running build's version and commit");
    pub const METRIC_SERIES: Metric = gauge("sluice_metric_series", "Per-rule metric series, by kind: operator (one per rule in force) and client (made from client input, at most METRICS_MAX_CLIENT_SERIES)");
    pub const REQUEST_DURATION: Metric = Metric { name: "sluice_request_duration_seconds", help: "How long gRPC ShouldRateLimit calls took", kind: Kind::Histogram };
}

// The entity table (registered by `rls::RateLimiter`).
#[rustfmt::skip]
mod entities {
    use super::{counter, gauge, Metric};
    pub const ENTITIES: Metric = gauge("sluice_entities", "Entities (rule + descriptor values) with counters in memory");
    pub const ENTITY_TABLE_CAPACITY: Metric = gauge("sluice_entity_table_capacity", "Entities the table holds before it evicts (CACHE_MAX_ENTRIES, rounded up to its shards)");
    pub const ENTITY_EVICTIONS: Metric = counter("sluice_entity_evictions_total", "Entities that left the table, by kind: free (held nothing), live (counts folded into the sketch), idle (swept, held nothing), ttl (swept past CACHE_TTL, folded)");
    pub const ENTITY_RESTORED: Metric = counter("sluice_entity_restored_total", "Entities created from the sketch's over-estimate of an evicted entity");
    pub const ENTITY_OVER_BOUND: Metric = counter("sluice_entity_over_bound_total", "Entities added past the bound because every one sampled for eviction was held by a sync");
}

// Each rule's limit and how near its keys are (registered by `rls::RateLimiter`, `rls/top.rs`).
#[rustfmt::skip]
mod utilization {
    use super::{gauge, Metric};
    pub const RULE_LIMIT: Metric = gauge("sluice_rule_limit", "A rule's requests_per_unit (its first limit)");
    pub const RULE_UNIT_SECONDS: Metric = gauge("sluice_rule_unit_seconds", "A rule's window in seconds (its first limit's unit times unit_multiplier): the period of the near and over gauges");
    pub const RULE_TRACKED_KEYS: Metric = gauge("sluice_rule_tracked_keys", "Keys (descriptor values) of a rule with counters in this replica's memory");
    pub const RULE_NEAR_LIMIT_KEYS: Metric = gauge("sluice_rule_near_limit_keys", "Keys of a rule counted at or past NEAR_LIMIT_RATIO of its limit (over included) in the current window (docs/operations.md)");
    pub const RULE_OVER_LIMIT_KEYS: Metric = gauge("sluice_rule_over_limit_keys", "Keys of a rule denied at least once in the current window (docs/operations.md)");
}

// Global mode's sync (registered by `global`).
#[rustfmt::skip]
mod sync {
    use super::{counter, gauge, Metric};
    pub const SYNC_TICKS: Metric = counter("sluice_sync_ticks_total", "Sync ticks, all shards");
    pub const SYNC_ITEMS: Metric = counter("sluice_sync_items_total", "Entity limits sent in syncs");
    pub const REDIS_COMMANDS: Metric = counter("sluice_redis_commands_total", "Commands sent to Redis by syncs");
    pub const SYNC_DELTAS_DROPPED: Metric = counter("sluice_sync_deltas_dropped_total", "Hits that could not be kept for sync");
    pub const SYNC_TIER_TRANSITIONS: Metric = counter("sluice_sync_tier_transitions_total", "Entities whose pressure tier changed at a sync");
    pub const SYNC_ESTIMATE_DRIFT: Metric = counter("sluice_sync_estimate_drift_hits_total", "Sum of |estimate after a sync - before|, in hits");
    pub const SYNC_CALL_SECONDS: Metric = counter("sluice_sync_call_seconds_total", "Time spent in Redis sync calls (microseconds / 1e6)");
    pub const SYNC_TASK_FAILURES: Metric = counter("sluice_sync_task_failures_total", "Sync and clock-offset tasks that panicked or ended before shutdown (each restarted)");
    pub const REDIS_ERRORS: Metric = counter("sluice_redis_errors_total", "Failed Redis sync calls");
    pub const SYNC_CALLS: Metric = counter("sluice_sync_calls_total", "Redis sync calls, by result (resized: timed out for its size and sent again smaller, the shard not marked degraded)");
    pub const SYNC_ENTITIES: Metric = counter("sluice_sync_entities_total", "Entity limits synced, by pressure tier at the sync");
    pub const SYNC_PENDING_ENTITIES: Metric = gauge("sluice_sync_pending_entities", "Entities waiting to sync");
    pub const SYNC_LIVE_REPLICAS: Metric = gauge("sluice_sync_live_replicas", "Live replicas (this one included) as the Redis heartbeats last counted them");
    pub const REDIS_SHARD_DEGRADED: Metric = gauge("sluice_redis_shard_degraded", "1 while a Redis shard's last call failed");
    pub const REDIS_LAST_SYNC: Metric = gauge("sluice_redis_last_sync_unix_seconds", "When a shard's last sync succeeded (staleness = now - this)");
    pub const SYNC_BATCH_ITEMS: Metric = gauge("sluice_sync_batch_items", "The most items a shard's next sync call carries, sized by how fast the shard answers (500 to 20,000)");
    pub const SYNC_STORE_RESETS: Metric = counter("sluice_sync_store_resets_total", "Times a Redis shard was found to have lost the sync's keys (restarted empty, flushed or replaced: its generation changed); the replicas restore the counts from memory");
    pub const RESET_LOG_APPLIED: Metric = counter("sluice_reset_log_applied_total", "Resets made through other replicas (or this one) read from a shard's reset log, each clearing this replica's view of one key");
    pub const RESET_LOG_MISSED: Metric = counter("sluice_reset_log_missed_total", "Resets trimmed from a shard's reset log before this replica read them (it was cut off from Redis): their keys are cleared at their next sync");
    pub const PRESENCE_CALLS: Metric = counter("sluice_rlqs_presence_calls_total", "Redis calls publishing this replica's quota-service streams per counter (one per shard a tick), by result");
    pub const PRESENCE_ITEMS: Metric = counter("sluice_rlqs_presence_items_total", "Counters sent in presence calls (removals included)");
}

// Exact rules (registered by `rls`'s exact path).
#[rustfmt::skip]
mod exact {
    use super::{counter, Metric};
    pub const EXACT_FALLBACK: Metric = counter("sluice_exact_fallback_total", "Exact descriptors decided from memory on the prior (1.05 × limit / live replicas) because Redis failed");
    pub const EXACT_FROM_MEMORY: Metric = counter("sluice_exact_from_memory_total", "Exact requests answered from memory: a key known to be over in its window");
    pub const EXACT_GIVEN_BACK: Metric = counter("sluice_exact_given_back_total", "Exact calls that gave their hits back (another shard refused or failed)");
    pub const EXACT_CALLS: Metric = counter("sluice_exact_calls_total", "Exact rules' Redis calls, by result");
}

// The quota service (registered by `rlqs::register_metrics`).
#[rustfmt::skip]
mod quota {
    use super::{counter, gauge, Metric};
    pub const RLQS_STREAMS: Metric = gauge("sluice_rlqs_streams", "Quota (RLQS) streams open");
    pub const RLQS_BUCKETS: Metric = gauge("sluice_rlqs_buckets", "Quota buckets tracked, every stream together");
    pub const RLQS_REPORTS: Metric = counter("sluice_rlqs_reports_total", "Quota usage reports taken");
    pub const RLQS_ASSIGNMENTS: Metric = counter("sluice_rlqs_assignments_total", "Quota assignments sent, by kind: token_bucket, deny_all, allow_all");
    pub const RLQS_ABANDONS: Metric = counter("sluice_rlqs_abandons_total", "Quota buckets abandoned (idle past RLQS_ABANDON_AFTER)");
    pub const RLQS_REFUSED: Metric = counter("sluice_rlqs_refused_total", "Quota streams and buckets refused at a bound, and streams ended by a bad report, by what: stream, bucket, report");
}

pub use entities::*;
pub use exact::*;
pub use quota::*;
pub use service::*;
pub use sync::*;
pub use utilization::*;

/// Every metric of this table, in the order docs/operations.md lists their groups.
pub const ALL: &[Metric] = &[
    REQUESTS,
    REQUEST_ERRORS,
    DECISIONS,
    CACHE,
    CONFIG_LOADS,
    METRIC_SERIES,
    BUILD_INFO,
    REQUEST_DURATION,
    ENTITIES,
    ENTITY_TABLE_CAPACITY,
    ENTITY_EVICTIONS,
    ENTITY_RESTORED,
    ENTITY_OVER_BOUND,
    RULE_LIMIT,
    RULE_UNIT_SECONDS,
    RULE_TRACKED_KEYS,
    RULE_NEAR_LIMIT_KEYS,
    RULE_OVER_LIMIT_KEYS,
    SYNC_TICKS,
    SYNC_ITEMS,
    REDIS_COMMANDS,
    SYNC_DELTAS_DROPPED,
    SYNC_TIER_TRANSITIONS,
    SYNC_ESTIMATE_DRIFT,
    SYNC_CALL_SECONDS,
    SYNC_TASK_FAILURES,
    REDIS_ERRORS,
    SYNC_CALLS,
    SYNC_ENTITIES,
    SYNC_PENDING_ENTITIES,
    SYNC_LIVE_REPLICAS,
    REDIS_SHARD_DEGRADED,
    REDIS_LAST_SYNC,
    SYNC_BATCH_ITEMS,
    SYNC_STORE_RESETS,
    RESET_LOG_APPLIED,
    RESET_LOG_MISSED,
    PRESENCE_CALLS,
    PRESENCE_ITEMS,
    EXACT_FALLBACK,
    EXACT_FROM_MEMORY,
    EXACT_GIVEN_BACK,
    EXACT_CALLS,
    RLQS_STREAMS,
    RLQS_BUCKETS,
    RLQS_REPORTS,
    RLQS_ASSIGNMENTS,
    RLQS_ABANDONS,
    RLQS_REFUSED,
];

/// The prefix of the per-rule gauges' names (`sluice_rule_limit`, ...).
pub const RULE_GAUGE_PREFIX: &str = "sluice_rule_";

/// The prefix of the per-rule counters' names: `ratelimit_<suffix>_total` on `/metrics`.
pub const RULE_COUNTER_PREFIX: &str = "ratelimit_";

/// The reference's per-rule counters: the suffix of their names, what they count, and how to
/// read them. Every exporter of them reads this table: `/metrics` (`ratelimit_<suffix>_total`),
/// statsd (`statsd.rs`) and the reference's Prometheus names (`prometheus_ref.rs`).
pub const RULE_COUNTERS: [(&str, &str, ReadCounter); 5] = [
    ("total_hits", "Hits seen per rule", |s| {
        s.total_hits.load(Ordering::Relaxed)
    }),
    ("over_limit", "Hits over the limit per rule", |s| {
        s.over_limit.load(Ordering::Relaxed)
    }),
    (
        "near_limit",
        "Hits within the limit but past NEAR_LIMIT_RATIO of it",
        |s| s.near_limit.load(Ordering::Relaxed),
    ),
    ("within_limit", "Hits within the limit per rule", |s| {
        s.within_limit.load(Ordering::Relaxed)
    }),
    (
        "shadow_mode",
        "Over-limit hits let through by shadow mode",
        |s| s.shadow_mode.load(Ordering::Relaxed),
    ),
];

/// The `/metrics` name of a per-rule counter: `ratelimit_<suffix>_total`.
pub fn rule_counter_name(suffix: &str) -> String {
    format!("{RULE_COUNTER_PREFIX}{suffix}_total")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_typed_by_their_suffix() {
        let mut names: Vec<_> = ALL.iter().map(|m| m.name).collect();
        names.extend(RULE_COUNTERS.map(|(suffix, ..)| suffix));
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name is listed twice");
        for m in ALL {
            assert!(m.name.starts_with("sluice_"), "{}", m.name);
            assert!(!m.name.starts_with(RULE_COUNTER_PREFIX), "{}", m.name);
            assert_eq!(
                m.name.ends_with("_total"),
                m.kind == Kind::Counter,
                "{}: counters, and only they, end in _total",
                m.name
            );
            assert!(!m.help.is_empty(), "{}", m.name);
        }
        assert_eq!(
            rule_counter_name("total_hits"),
            "ratelimit_total_hits_total"
        );
    }
}
