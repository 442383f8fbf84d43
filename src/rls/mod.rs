//! The RLS v3 semantics of `ShouldRateLimit`, independent of the transport (gRPC or HTTP JSON),
//! in four steps, one file each: `validate.rs` (request checks and bounds), `resolve.rs`
//! (descriptor → rule and entity, limit overrides, `replaces`), `evaluate.rs` (limits checked
//! and counted on the entity by `core::decide`) and `respond.rs` (statuses, overall code,
//! headers, with `ietf.rs` for the IETF fields and the problem body, `metadata.rs` for the
//! dynamic metadata and the quota groups, and `denied.rs` for the rules behind a decision in
//! it); `answer.rs` runs evaluate and respond over a request's targets. Each step is a
//! function handed only what it uses (`validate` the options; `resolve_all` the rules in
//! force and their metric series; `evaluate` a [`evaluate::Counting`]: the table, the fleet
//! view, the queues), so a step cannot reach what comes after it; the limiter only hands
//! them out. `gate.rs` refuses requests once shutdown has begun. `exact.rs` decides
//! `exact: true` rules in global mode against the store
//! ([`RateLimiter::should_rate_limit_async`]), its verdict on the store's counts the core's
//! (`core/exact.rs`). `unit.rs` is the one mapping between the rules' units and the
//! protocol's. `options.rs` holds the switches and bounds ([`Options`]). The operator's
//! calls are functions handed what they use too: `explain.rs` says what a request would be
//! answered, and why, counting nothing (`POST /explain`), `reset.rs` clears its counters
//! (`POST /reset`), `top.rs` lists the keys nearest their limits (`GET /top`).
//! `table_metrics.rs` registers the entity table's metrics.
//!
//! These semantics follow envoyproxy/ratelimit (docs/wire.md):
//! - `hits_addend`: a descriptor's own value wins, 0 included (check without counting);
//!   otherwise `max(1, request.hits_addend)`, since Envoy sends 0.
//! - No rule (unknown domain, whitelisted node, depth mismatch, replaced): `OK`, no limit,
//!   remaining 0. Unlimited: `OK`, no limit, remaining `u32::MAX`, nothing counted.
//! - Limited: `count > limit` after counting is `OVER_LIMIT` with 0 left; the limit exactly is
//!   `OK` with 0 left. `duration_until_reset` is the time left in the epoch-aligned window.
//! - Overall `OVER_LIMIT` iff a non-quota descriptor is over, or every quota group is (quota
//!   descriptors of one `backend_name`/`model_name_override` pair are a group, over when one
//!   of them is; the others, a group per distinct entry list: `metadata.rs`, `QuotaGroups`).
//!   Rule `shadow_mode` reports `OK`; global shadow mode makes only the overall code `OK`.
//! - With `stop_increment_when_over_limit`, when any descriptor would go over, the ones that
//!   would stay within their limits are not counted, and report their count as it stands.
//! - Every hit is counted, admitted or not (the reference's `INCRBY`), unless the limit says
//!   `strict: false`: then a denied request costs nothing.

mod answer;
mod decision_log;
mod denied;
mod evaluate;
mod exact;
mod explain;
#[cfg(test)]
mod explain_tests;
mod gate;
mod ietf;
mod metadata;
#[cfg(test)]
mod metrics_tests;
mod options;
mod quota;
mod reset;
mod resolve;
mod respond;
mod table_metrics;
mod top;
mod unit;
mod validate;

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::core::clock::{Clock, UnixMillis};
use crate::core::table::{EntityTable, RuleCounts};
use crate::core::FleetView;
use crate::global::{ExactClient, Fleet, SyncQueues};
use crate::rules::model::ConfigError;
use crate::rules::{EntryRef, RuleSet};
use crate::telemetry::{RuleStats, Telemetry};
use answer::{answer, Answering};
use decision_log::DecisionLog;
use evaluate::Counting;
use exact::OverCache;
pub use explain::{
    DescriptorExplanation, EntryJson, Explanation, LimitJson, NoMatchJson, RuleJson, SourceJson,
};
use gate::Gate;
pub use options::{HeaderFormat, HeaderNames, Options, EXACT_BELOW};
pub use quota::QuotaCount;
pub use reset::{Cleared, ClearedDescriptor, ClearedLimit, ResetError};
use resolve::resolve_all;
pub use top::{TopKey, TopKeys, TopQuery, MAX_TOP, TOP_READ_BUDGET};

impl EntryRef for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Why a request was refused. Every variant but [`RequestError::ShuttingDown`] is the caller's
/// mistake (INVALID_ARGUMENT / 400); that one is ours (UNAVAILABLE / 503), so Envoy's
/// `failure_mode_deny` decides.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The domain is empty.
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// No descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// More descriptors than `max_descriptors`.
    #[error("too many descriptors: {count} (at most {max})")]
    TooManyDescriptors {
        /// Descriptors sent.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A descriptor with more entries than `max_entries`.
    #[error("descriptor {index} has {count} entries (at most {max})")]
    TooManyEntries {
        /// The descriptor's position.
        index: usize,
        /// Entries sent.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A key or value longer than `max_value_bytes`.
    #[error("descriptor {index}: an entry key or value is {len} bytes (at most {max})")]
    ValueTooLong {
        /// The descriptor's position.
        index: usize,
        /// The longest length found.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A limit override whose unit is not a known unit.
    #[error("descriptor {index}: limit override has an unknown unit ({unit})")]
    BadOverrideUnit {
        /// The descriptor's position.
        index: usize,
        /// The unit number sent.
        unit: i32,
    },
    /// The service is shutting down and decides nothing more.
    #[error("shutting down")]
    ShuttingDown,
}

impl RequestError {
    /// Whether the request itself is at fault (else the service is).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, RequestError::ShuttingDown)
    }
}

/// A compiled rule set with its metric handles, swapped in whole on reload.
#[derive(Debug)]
pub struct Compiled {
    /// The rules.
    pub rules: RuleSet,
    stats: Vec<Arc<RuleStats>>,
    /// Each rule's counts in the entity table (`core/table/counts.rs`), in rule order.
    counts: Vec<Arc<RuleCounts>>,
    /// The files the rules came from.
    pub files: Vec<String>,
    /// When the set was swapped in.
    pub applied_at: UnixMillis,
    /// Some rule says `exact: true`.
    has_exact: bool,
}

/// Records of each table shard a sweep looks at: 64 shards × 4,096 a second go over a full
/// table of a million entities in 4 s, at about 1 % of a core.
const SWEEP_BUDGET: usize = 4096;

/// Global mode's ways to the fleet, handed to the limiter at its start: what the wiring
/// built before global mode starts and hands `global::spawn` too (`global::Parts`), and
/// the exact rules' client.
pub struct GlobalMode {
    /// Where entities with news are queued for the background sync.
    pub queues: Arc<SyncQueues>,
    /// What the heartbeats say of the fleet, read for each decision.
    pub fleet: Arc<Fleet>,
    /// Exact rules' way to the store; without it `exact: true` changes nothing.
    pub exact: Option<ExactClient>,
}

/// The rate limiter: the rules in force, the counters and the clock.
pub struct RateLimiter {
    rules: ArcSwap<Compiled>,
    entities: EntityTable,
    /// Global mode: where entities with news are queued for the background sync.
    sync: Option<Arc<SyncQueues>>,
    /// Global mode: what the heartbeats say of the fleet.
    fleet: Option<Arc<Fleet>>,
    /// Global mode: exact rules' way to the store.
    exact: Option<ExactClient>,
    /// Exact keys known to be over in their window.
    over: OverCache,
    clock: Arc<dyn Clock>,
    opts: Options,
    telemetry: Arc<Telemetry>,
    gate: Gate,
    /// The decision log (`DECISION_LOG_RATE`, debug).
    decisions: DecisionLog,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("entities", &self.entities)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

// === impl RateLimiter ===

impl RateLimiter {
    /// A limiter with `rules` in force, counting in `entities` (the wiring's table, the one
    /// `global::spawn` syncs in global mode; `opts.cache` sized it); with `global`, in global
    /// mode.
    pub fn new(
        rules: RuleSet,
        files: Vec<String>,
        clock: Arc<dyn Clock>,
        opts: Options,
        telemetry: Arc<Telemetry>,
        entities: EntityTable,
        global: Option<GlobalMode>,
    ) -> Arc<Self> {
        telemetry.rules.set_bounds(opts.metric_series);
        let (sync, fleet, exact) = match global {
            Some(g) => (Some(g.queues), Some(g.fleet), g.exact),
            None => (None, None, None),
        };
        if let Some(client) = &exact {
            exact::register_metrics(&telemetry, &client.stats);
        }
        let exact_below = exact.is_some().then_some(opts.exact_below);
        let policy = (exact_below, opts.override_series);
        let compiled =
            Self::compile_stats(&telemetry, &entities, (rules, policy), files, clock.now());
        let limiter = Arc::new(RateLimiter {
            rules: ArcSwap::from_pointee(compiled),
            entities,
            sync,
            fleet,
            exact,
            over: OverCache::default(),
            clock,
            decisions: DecisionLog::new(opts.decision_log_rate, opts.decision_log_values),
            opts,
            telemetry,
            gate: Gate::default(),
        });
        table_metrics::register(&limiter.telemetry, &limiter.entities);
        top::register_rule_gauges(&limiter, &limiter.telemetry);
        limiter
    }

    /// Drops idle entities (`EntityTable::sweep`): a slice of the table per call, called
    /// every second by the service.
    pub fn sweep(&self) -> u64 {
        self.entities.sweep(self.clock.now(), SWEEP_BUDGET)
    }

    /// A limiter in local mode with the rules in `yaml` (one rules file named `rules.yaml`)
    /// and a metrics pipeline of its own: for embedding, benchmarks and tests.
    ///
    /// # Errors
    /// The rules' errors.
    pub fn local(
        yaml: &str,
        clock: Arc<dyn Clock>,
        opts: Options,
    ) -> Result<Arc<Self>, Vec<ConfigError>> {
        let rules = crate::rules::compile_sources(&[("rules.yaml".into(), yaml.into())], false)?;
        let telemetry =
            Telemetry::new().map_err(|e| vec![ConfigError::new("metrics", e.to_string())])?;
        let entities = EntityTable::new(opts.cache);
        Ok(Self::new(
            rules,
            vec![],
            clock,
            opts,
            Arc::new(telemetry),
            entities,
            None,
        ))
    }

    /// `rules` with their metric series, given (`EXACT_BELOW` in global mode, `None` in
    /// local mode; `METRICS_OVERRIDE_SERIES`).
    fn compile_stats(
        t: &Telemetry,
        table: &EntityTable,
        (mut rules, (exact_below, override_series)): (RuleSet, (Option<u32>, bool)),
        files: Vec<String>,
        now: UnixMillis,
    ) -> Compiled {
        // Global mode: limits too small to share by estimates are shared exactly.
        if let Some(below) = exact_below {
            rules.decide_exactly_below(below);
        }
        let stats = rules
            .rules()
            .iter()
            .map(|r| {
                let key = match &r.override_of {
                    Some(rule) if !override_series => rule,
                    _ => &r.full_key,
                };
                t.rules.get(&r.domain, key)
            })
            .collect();
        let counts = top::counts_of(table, &rules);
        Compiled {
            has_exact: rules.has_exact(),
            rules,
            stats,
            counts,
            files,
            applied_at: now,
        }
    }

    /// Puts `rules` in force in one atomic step. Counters of unchanged rules carry over,
    /// since counters are keyed by rule identity, not by rule set; the series of rules no
    /// longer in force are dropped (with their client-made series), so that ConfigMap or
    /// xDS churn cannot grow the metrics without bound. Returns the rules that were in force,
    /// for the caller to drop where it costs no request anything (`sources/mod.rs`).
    pub fn swap_rules(&self, rules: RuleSet, files: Vec<String>) -> Arc<Compiled> {
        let exact_below = self.exact.is_some().then_some(self.opts.exact_below);
        let compiled = Arc::new(Self::compile_stats(
            &self.telemetry,
            &self.entities,
            (rules, (exact_below, self.opts.override_series)),
            files,
            self.clock.now(),
        ));
        // Swapped first, so that requests from now on make no series for removed rules.
        let old = self.rules.swap(compiled.clone());
        top::forget_removed(&old, &compiled);
        let keep: std::collections::HashSet<(&str, &str)> = compiled
            .rules
            .rules()
            .iter()
            .map(|r| (r.domain.as_str(), r.full_key.as_str()))
            .collect();
        self.telemetry.rules.retain_rules(|domain, key| {
            keep.contains(&(domain, key))
                || (compiled.rules.has_domain(domain)
                    && key.strip_prefix(domain) == Some(".override"))
        });
        old
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Compiled> {
        self.rules.load_full()
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The metrics pipeline.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// Answers one `ShouldRateLimit` request at the clock's current time: validate →
    /// resolve → evaluate → respond. Exact rules are decided from memory here, as in local
    /// mode; [`RateLimiter::should_rate_limit_async`] sends them to the store.
    ///
    /// # Errors
    /// [`RequestError`] when the request is malformed or the service is shutting down;
    /// nothing is counted then.
    pub fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        let _open = self.gate.enter().ok_or(RequestError::ShuttingDown)?;
        self.admit(req)?;
        let now = self.clock.now();
        let compiled = self.rules.load();
        let targets = resolve_all(&compiled, &self.telemetry.rules, req);
        Ok(answer(
            &self.answering(),
            req,
            &targets,
            &hits_of(req),
            now,
            &[],
        ))
    }

    /// [`RateLimiter::should_rate_limit_async`]'s answer when it needs no store call (local
    /// mode, or no exact rules in force), without a future to poll; `None` when it does.
    pub fn should_rate_limit_now(
        &self,
        req: &RateLimitRequest,
    ) -> Option<Result<RateLimitResponse, RequestError>> {
        if self.exact.is_some() && self.rules.load().has_exact {
            return None;
        }
        Some(self.should_rate_limit(req))
    }

    /// Like [`RateLimiter::should_rate_limit`], but in global mode a request with exact
    /// descriptors awaits one atomic store call per shard for them (docs/global.md, "Exact rules");
    /// any other request is answered at once, without an await.
    ///
    /// The gate is left during the store call (shutdown does not wait for Redis) and entered
    /// again for the rest: a request that finds it closed then is refused, though the store
    /// may have counted its exact hits.
    ///
    /// # Errors
    /// As [`RateLimiter::should_rate_limit`].
    pub async fn should_rate_limit_async(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        let Some(client) = &self.exact else {
            return self.should_rate_limit(req);
        };
        if !self.rules.load().has_exact {
            return self.should_rate_limit(req);
        }
        let compiled = self.rules.load_full();
        let open = self.gate.enter().ok_or(RequestError::ShuttingDown)?;
        self.admit(req)?;
        let now = self.clock.now();
        let targets = resolve_all(&compiled, &self.telemetry.rules, req);
        let hits = hits_of(req);
        let refund = |i: usize| req.descriptors[i].is_negative_hits;
        let answered =
            |answers: &[_]| answer(&self.answering(), req, &targets, &hits, now, answers);
        let Some(mut plan) = exact::plan(&targets, &hits, refund, now) else {
            return Ok(answered(&[]));
        };
        if let Some(answers) = exact::from_memory(&self.exact_way(client), &plan, now) {
            return Ok(answered(&answers));
        }
        // With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, a normal descriptor over holds the
        // exact ones back too.
        plan.commit = !(self.opts.stop_increment_when_over_limit
            && answer::any_over(&self.counting(), req, &targets, &hits, now, &[]));
        drop(open);
        let reply = client.check_and_count(&plan.items, plan.commit).await;
        let _open = self.gate.enter().ok_or(RequestError::ShuttingDown)?;
        let answers = exact::answers(&self.exact_way(client), &plan, reply, now);
        Ok(answered(&answers))
    }

    /// Counts the request and validates it.
    fn admit(&self, req: &RateLimitRequest) -> Result<(), RequestError> {
        let stats = &self.telemetry.service;
        RuleStats::add(&stats.requests, 1);
        validate::validate(&self.opts, req).inspect_err(|_| {
            RuleStats::add(&stats.invalid_requests, 1);
        })
    }

    /// What answering a request is handed: [`RateLimiter::counting`], the options and the
    /// decision log.
    fn answering(&self) -> Answering<'_> {
        Answering {
            counting: self.counting(),
            opts: &self.opts,
            decisions: &self.decisions,
        }
    }

    /// What evaluating is handed for one request: the table, the fleet as the heartbeats
    /// last said (read once), the queues; nothing else of the limiter.
    fn counting(&self) -> Counting<'_> {
        Counting {
            table: &self.entities,
            fleet: self.fleet.as_ref().map(|f| f.view()),
            queues: self.sync.as_deref(),
            near_limit_ratio: self.opts.near_limit_ratio,
            stats: &self.telemetry.service,
        }
    }

    /// What the exact path is handed (global mode, with `client`): the fleet as the
    /// heartbeats say it now.
    fn exact_way<'a>(&'a self, client: &'a ExactClient) -> exact::ExactWay<'a> {
        exact::ExactWay {
            over: &self.over,
            stats: &client.stats,
            fleet: self.fleet.as_ref().map_or(FleetView::ALONE, |f| f.view()),
            redis_errors: &self.telemetry.service.redis_errors,
        }
    }

    /// What `req` would be answered now, and why, counting nothing (`explain.rs`).
    /// Validated as a request is.
    ///
    /// # Errors
    /// [`RequestError`] as [`RateLimiter::should_rate_limit`] refuses.
    pub async fn explain(&self, req: &RateLimitRequest) -> Result<Explanation, RequestError> {
        // Refused once shutdown has begun, like a request; not held after, since an
        // explanation counts nothing a final flush must see.
        drop(self.gate.enter().ok_or(RequestError::ShuttingDown)?);
        validate::validate(&self.opts, req)?;
        let compiled = self.rules.load_full();
        let at = explain::Explaining {
            compiled: &compiled,
            table: &self.entities,
            fleet: self.fleet.as_deref(),
            exact: self.exact.as_ref(),
            opts: &self.opts,
        };
        Ok(explain::explain(&at, req, self.clock.now()).await)
    }

    /// Clears the counters of every descriptor of `req`, resolved as in a decision, and
    /// returns what was cleared (`reset.rs`).
    ///
    /// # Errors
    /// A malformed request; in global mode, a store that could not be reset (then nothing
    /// is cleared in memory either, and a retry is safe: a reset of a reset count is one).
    pub async fn reset(&self, req: &RateLimitRequest) -> Result<Cleared, ResetError> {
        validate::validate(&self.opts, req)?;
        let now = self.clock.now();
        let compiled = self.rules.load_full();
        let targets = resolve_all(&compiled, &self.telemetry.rules, req);
        let at = reset::Resetting {
            table: &self.entities,
            queues: self.sync.as_deref(),
            exact: self.exact.as_ref(),
            over: &self.over,
        };
        reset::reset(&at, &req.domain, &targets, now).await
    }

    /// The `q.n` keys with the highest count ÷ limit now among the rules `q` selects,
    /// highest first (`top.rs`). Counts nothing.
    pub fn top(&self, q: TopQuery<'_>) -> TopKeys {
        let fleet = self.fleet.as_ref().map_or(FleetView::ALONE, |f| f.view());
        top::top(
            &self.rules.load(),
            &self.entities,
            &fleet,
            self.clock.now(),
            q,
        )
    }

    /// Refuses every request from now on ([`RequestError::ShuttingDown`]) and returns once
    /// the requests being decided are done, so that a final flush after it sees every hit
    /// this process will ever count.
    pub fn close(&self) {
        self.gate.close();
    }

    /// The number of entities with counters in memory.
    pub fn entity_count(&self) -> u64 {
        self.entities.len()
    }

    /// The clock the limiter decides with.
    pub fn now(&self) -> UnixMillis {
        self.clock.now()
    }
}

/// Each descriptor's hits: its own `hits_addend` wins (0 included), else
/// `max(1, request.hits_addend)`.
fn hits_of(req: &RateLimitRequest) -> Vec<u64> {
    let default_hits = u64::from(req.hits_addend.max(1));
    req.descriptors
        .iter()
        .map(|d| d.hits_addend.map_or(default_hits, |h| h.value))
        .collect()
}
