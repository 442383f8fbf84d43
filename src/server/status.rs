//! `GET /status.json` on the admin port: what the status page (`page.rs`) shows, in one
//! bounded answer. The version and commit, the mode, the rules in force (each with its
//! limits and where it was written), the last reload, the fleet and each Redis shard's
//! health in global mode, the quota service's streams and buckets, and whether `/top`
//! needs the admin token.
//!
//! It holds no descriptor value a request sent: only what the rules files (or xDS) say,
//! and counts. So it needs no token, as `/rlconfig` does not. Every list in it is capped
//! ([`MAX_STATUS_RULES`], [`MAX_STATUS_ERRORS`], [`MAX_STATUS_STREAMS`]) and says how many
//! it left out, so a page polled every few seconds costs a bounded answer however many rules
//! are loaded.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::admin_state::AdminState;
pub use super::rule_sources::{locate_sources, Sources, LOCATE_BUDGET_BYTES};
use crate::core::Algorithm;
use crate::rules::{Rule, RuleSet};

/// The most rules `/status.json` lists; past it, `rules.more` says how many were left out.
pub const MAX_STATUS_RULES: usize = 1000;

/// The most rules files, and the most errors of a rejected reload, it lists (each with its
/// own `more` count).
pub const MAX_STATUS_ERRORS: usize = 50;

/// The most quota streams it lists; past it, `rlqs.streams_more` says how many were left
/// out.
pub const MAX_STATUS_STREAMS: usize = 100;

/// Whether `/top` (descriptor values: secrets, often) answers, as the page must know
/// before it asks: it never asks when it would only be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TopAccess {
    /// `ADMIN_TOKEN_FILE` is set: `/top` needs `Authorization: Bearer <token>`.
    Token,
    /// `ADMIN_OPEN_READS=true`: `/top` answers anyone who reaches the admin port.
    Open,
    /// No token is configured: `/top` is refused.
    Off,
}

/// The whole answer.
#[derive(Debug, Serialize)]
pub struct Status {
    /// The package version.
    pub version: &'static str,
    /// The commit it was built from.
    pub commit: &'static str,
    /// `local` or `global`.
    pub mode: &'static str,
    /// Whether `/readyz` says ready.
    pub ready: bool,
    /// When this answer was made (Unix ms, the service's clock).
    pub now_unix_ms: u64,
    /// The rules in force.
    pub rules: RulesJson,
    /// The loads of rules.
    pub reload: ReloadJson,
    /// Global mode: the fleet as this replica sees it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetJson>,
    /// Global mode: each Redis shard's health, in shard order (empty in local mode).
    pub shards: Vec<ShardJson>,
    /// The quota service, when it is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlqs: Option<RlqsJson>,
    /// Whether `/top` needs a token.
    pub top: TopAccess,
}

/// The rules in force, the first [`MAX_STATUS_RULES`] listed.
#[derive(Debug, Serialize)]
pub struct RulesJson {
    /// Rules compiled.
    pub count: usize,
    /// Domains with rules.
    pub domains: usize,
    /// The rules listed, in load order.
    pub listed: Vec<RuleStatus>,
    /// Rules not listed.
    pub more: usize,
}

/// One rule in force.
#[derive(Debug, Serialize)]
pub struct RuleStatus {
    /// Its domain.
    pub domain: String,
    /// `rate_limit.name` (empty when unnamed).
    pub name: String,
    /// Its path in the tree, as metrics name it.
    pub full_key: String,
    /// Its limits (empty when unlimited).
    pub limits: Vec<LimitStatus>,
    /// Never counted or denied.
    pub unlimited: bool,
    /// Its `shadow_mode`.
    pub shadow_mode: bool,
    /// `exact: true`.
    pub exact: bool,
    /// Its file, and the line when found within the answer's budget; or `xds:<resource>`.
    pub source: String,
}

/// One limit of a rule.
#[derive(Debug, Serialize)]
pub struct LimitStatus {
    /// `sliding_window`, `fixed_window`, `token_bucket` or `concurrency`.
    pub algorithm: &'static str,
    /// Hits a window (a bucket: tokens refilled a window).
    pub requests_per_unit: u32,
    /// `SECOND` ... `YEAR`.
    pub unit: &'static str,
    /// Units in a window.
    pub unit_multiplier: u64,
    /// A token bucket's capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

/// The loads of rules.
#[derive(Debug, Serialize)]
pub struct ReloadJson {
    /// Loads applied since start.
    pub loads: u64,
    /// When the rules in force were applied (Unix ms).
    pub applied_at_unix_ms: u64,
    /// Whether the last load was applied (`false`: it was rejected and the rules in force
    /// are the previous ones).
    pub ok: bool,
    /// The rejected load's errors, the first [`MAX_STATUS_ERRORS`].
    pub errors: Vec<String>,
    /// Errors not listed.
    pub errors_more: usize,
    /// Since when loads are rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors_since_unix_ms: Option<u64>,
    /// The files (or xDS resources) the rules in force came from, the first
    /// [`MAX_STATUS_ERRORS`].
    pub files: Vec<String>,
    /// Files not listed.
    pub files_more: usize,
}

/// The fleet, in global mode.
#[derive(Debug, Serialize)]
pub struct FleetJson {
    /// This replica's id in the heartbeats.
    pub replica_id: String,
    /// Live replicas, this one included.
    pub live: u32,
    /// The `/readyz` line: where the join is.
    pub join: String,
}

/// One Redis shard's health.
#[derive(Debug, Serialize)]
pub struct ShardJson {
    /// Its name.
    pub name: String,
    /// Whether its last call succeeded.
    pub ok: bool,
    /// `ok`, `not answered yet` or `degraded: <why>`.
    pub status: String,
    /// When its last call succeeded (Unix ms; 0: never).
    pub last_success_unix_ms: u64,
}

/// The quota service's streams and buckets on this replica.
#[derive(Debug, Serialize)]
pub struct RlqsJson {
    /// Open streams.
    pub streams: usize,
    /// Tracked (stream, bucket) pairs, every stream together.
    pub buckets: usize,
    /// Counters with members here.
    pub counters: usize,
    /// `RLQS_MAX_STREAMS`.
    pub max_streams: usize,
    /// `RLQS_MAX_BUCKETS`.
    pub max_buckets: usize,
    /// The first [`MAX_STATUS_STREAMS`] open streams, oldest first: each one's domain and
    /// bucket count.
    pub listed: Vec<crate::rlqs::listing::StreamSummary>,
    /// Open streams not listed.
    pub streams_more: usize,
}

/// The first `max` of `items`, and how many were left out.
fn capped<T: Clone>(items: &[T], max: usize) -> (Vec<T>, usize) {
    let listed = items.iter().take(max).cloned().collect::<Vec<_>>();
    let more = items.len() - listed.len();
    (listed, more)
}

fn limits(rule: &Rule) -> Vec<LimitStatus> {
    if rule.unlimited {
        return Vec::new();
    }
    rule.limits
        .iter()
        .map(|spec| {
            let l = &spec.limit;
            let (algorithm, burst) = match l.algorithm {
                Algorithm::SlidingWindow => ("sliding_window", None),
                Algorithm::FixedWindow => ("fixed_window", None),
                Algorithm::TokenBucket { burst } => ("token_bucket", Some(burst)),
                Algorithm::Concurrency => ("concurrency", None),
            };
            LimitStatus {
                algorithm,
                requests_per_unit: l.requests_per_unit,
                unit: spec.unit.name(),
                unit_multiplier: (l.window_ms / 1000 / spec.unit.seconds()).max(1),
                burst,
            }
        })
        .collect()
}

/// The first `max` rules of `set`, each with its source from `sources` (in rule order),
/// and how many more there are.
pub fn rules_json(set: &RuleSet, max: usize, sources: &[String]) -> RulesJson {
    let all = set.rules();
    let listed = all
        .iter()
        .take(max)
        .enumerate()
        .map(|(i, r)| RuleStatus {
            domain: r.domain.clone(),
            name: r.name.clone(),
            full_key: r.full_key.clone(),
            limits: limits(r),
            unlimited: r.unlimited,
            shadow_mode: r.shadow_mode,
            exact: r.exact,
            source: sources.get(i).cloned().unwrap_or_default(),
        })
        .collect::<Vec<_>>();
    RulesJson {
        count: all.len(),
        domains: set.domain_count(),
        more: all.len() - listed.len(),
        listed,
    }
}

/// The reload part, from [`crate::sources::ReloadStatus::snapshot`]'s parts and the files
/// in force, each list capped at `max`.
pub fn reload_json(
    loads: u64,
    applied_at_unix_ms: u64,
    errors: &[String],
    errors_since_unix_ms: Option<u64>,
    files: &[String],
    max: usize,
) -> ReloadJson {
    let (listed_errors, errors_more) = capped(errors, max);
    let (listed_files, files_more) = capped(files, max);
    ReloadJson {
        loads,
        applied_at_unix_ms,
        ok: errors.is_empty(),
        errors: listed_errors,
        errors_more,
        errors_since_unix_ms,
        files: listed_files,
        files_more,
    }
}

/// What the state says now.
pub fn status(s: &AdminState) -> Status {
    let compiled = s.limiter.rules();
    let (loads, errors, since) = s.reload.snapshot();
    let fleet = s.fleet.as_ref().map(|f| FleetJson {
        // A string: a u64 past 2^53 loses its last digits in the page's JavaScript.
        replica_id: format!("{:016x}", f.replica_id()),
        live: f.live_replicas(),
        join: f.to_string(),
    });
    Status {
        version: env!("CARGO_PKG_VERSION"),
        commit: crate::COMMIT,
        mode: if s.shards.is_empty() {
            "local"
        } else {
            "global"
        },
        ready: s.readiness.is_ready(),
        now_unix_ms: s.limiter.now().0,
        rules: rules_json(
            &compiled.rules,
            MAX_STATUS_RULES,
            &s.status_sources.of(&compiled, MAX_STATUS_RULES),
        ),
        reload: reload_json(
            loads,
            compiled.applied_at.0,
            &errors,
            since.map(|t| t.0),
            &compiled.files,
            MAX_STATUS_ERRORS,
        ),
        fleet,
        shards: s
            .shards
            .iter()
            .map(|h| ShardJson {
                name: h.name.clone(),
                ok: h.has_answered() && !h.is_degraded(),
                status: h.status().to_string(),
                last_success_unix_ms: h.last_success_ms(),
            })
            .collect(),
        rlqs: s.quotas.as_ref().map(|q| {
            let (listed, streams_more) = q.streams_listed(MAX_STATUS_STREAMS);
            RlqsJson {
                streams: q.stream_count(),
                buckets: q.bucket_count(),
                counters: q.counter_count(),
                max_streams: q.config().max_streams,
                max_buckets: q.config().max_buckets,
                listed,
                streams_more,
            }
        }),
        top: match (&s.admin_token, s.open_reads) {
            (_, true) => TopAccess::Open,
            (Some(_), false) => TopAccess::Token,
            (None, false) => TopAccess::Off,
        },
    }
}

pub(super) async fn status_handler(State(s): State<AdminState>) -> Response {
    // Finding a new rule set's lines re-reads its files (up to the budget): off the
    // runtime's workers.
    let answer = tokio::task::spawn_blocking(move || status(&s)).await;
    match answer {
        Ok(st) => axum::Json(st).into_response(),
        Err(e) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("status: {e}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(n: usize) -> RuleSet {
        let mut yaml = String::from("domain: d\ndescriptors:\n");
        for i in 0..n {
            yaml.push_str(&format!(
                "  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}, name: r{i}}}\n",
                i + 1
            ));
        }
        crate::rules::compile_sources(&[("t.yaml".into(), yaml)], false).unwrap()
    }

    fn rules(set: &RuleSet, max: usize, budget: usize) -> RulesJson {
        rules_json(set, max, &locate_sources(set, max, budget))
    }

    #[test]
    fn rules_past_the_cap_are_counted_not_listed() {
        let set = set_of(7);
        let r = rules(&set, 5, LOCATE_BUDGET_BYTES);
        assert_eq!((r.count, r.listed.len(), r.more), (7, 5, 2));
        assert_eq!(r.listed[4].name, "r4");
        let all = rules(&set, 7, LOCATE_BUDGET_BYTES);
        assert_eq!((all.listed.len(), all.more), (7, 0));
    }

    #[test]
    fn a_rule_names_its_file_and_line_and_its_limits() {
        let set = set_of(2);
        let r = rules(&set, MAX_STATUS_RULES, LOCATE_BUDGET_BYTES);
        assert_eq!(r.listed[1].source, "t.yaml:5");
        assert_eq!(r.listed[1].full_key, "d.k1");
        let l = &r.listed[1].limits[0];
        assert_eq!(
            (l.algorithm, l.requests_per_unit, l.unit, l.unit_multiplier),
            ("sliding_window", 2, "MINUTE", 1)
        );
    }

    #[test]
    fn past_the_locate_budget_a_rule_names_its_file_only() {
        let set = set_of(3);
        let r = rules(&set, MAX_STATUS_RULES, 0);
        assert_eq!(r.listed[0].source, "t.yaml");
    }

    #[test]
    fn reload_errors_and_files_past_the_cap_are_counted() {
        let errors: Vec<String> = (0..60).map(|i| format!("e{i}")).collect();
        let files = vec!["a.yaml".to_string(), "b.yaml".to_string()];
        let r = reload_json(3, 9, &errors, Some(8), &files, MAX_STATUS_ERRORS);
        assert!(!r.ok);
        assert_eq!((r.errors.len(), r.errors_more), (MAX_STATUS_ERRORS, 10));
        assert_eq!((r.files.len(), r.files_more), (2, 0));
        let ok = reload_json(4, 9, &[], None, &files, 1);
        assert!(ok.ok);
        assert_eq!((ok.files.len(), ok.files_more), (1, 1));
    }
}
