//! The RLS v3 semantics of `ShouldRateLimit`, independent of the transport (gRPC or HTTP JSON):
//! request checks, rule lookup, `replaces`, limit overrides, counting, statuses, the overall
//! code with quota and shadow modes, and the rate-limit response headers.
//!
//! These semantics follow envoyproxy/ratelimit (DESIGN §1):
//! - `hits_addend`: a descriptor's own value wins, 0 included (check without counting);
//!   otherwise `max(1, request.hits_addend)`, since Envoy sends 0.
//! - No rule (unknown domain, whitelisted node, depth mismatch, replaced): `OK`, no limit,
//!   remaining 0. Unlimited: `OK`, no limit, remaining `u32::MAX`, nothing counted.
//! - Limited: `count > limit` after counting is `OVER_LIMIT` with 0 left; the limit exactly is
//!   `OK` with 0 left. `duration_until_reset` is the time left in the epoch-aligned window.
//! - Overall `OVER_LIMIT` iff a non-quota descriptor is over, or every quota descriptor is.
//!   Rule `shadow_mode` reports `OK`; global shadow mode makes only the overall code `OK`.
//! - With `stop_increment_when_over_limit`, when any descriptor would go over, the ones that
//!   would stay within their limits are not counted.

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use xxhash_rust::xxh3::Xxh3;

use crate::core::clock::{Clock, UnixMillis};
use crate::core::table::{CacheSettings, EntityCache};
use crate::core::{Algorithm, Limit, Verdict};
use crate::global::SyncQueues;
use crate::rules::model::ConfigError;
use crate::rules::{EntryRef, LimitSpec, Rule, RuleSet, Unit};
use crate::telemetry::{RuleStats, Telemetry};

impl EntryRef for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Names of the rate-limit response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit of the most restrictive descriptor.
    pub limit: String,
    /// Hits left under it.
    pub remaining: String,
    /// Seconds until its window resets.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Behaviour switches and request bounds of the service.
#[derive(Debug, Clone)]
pub struct Options {
    /// `SHADOW_MODE`: the overall code is always OK.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every rule is treated as a quota.
    pub quota_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: add rate-limit headers (with these names).
    pub response_headers: Option<HeaderNames>,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub stop_increment_when_over_limit: bool,
    /// `NEAR_LIMIT_RATIO`: counts past this share of the limit are "near limit" in metrics.
    pub near_limit_ratio: f64,
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest key or value, in bytes.
    pub max_value_bytes: usize,
    /// Limits of the entity table.
    pub cache: CacheSettings,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            shadow_mode: false,
            quota_mode: false,
            response_headers: None,
            stop_increment_when_over_limit: false,
            near_limit_ratio: 0.8,
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 4096,
            cache: CacheSettings::default(),
        }
    }
}

/// Why a request was refused. Every variant is the caller's mistake (INVALID_ARGUMENT / 400).
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
}

/// A compiled rule set with its metric handles, swapped in whole on reload.
#[derive(Debug)]
pub struct Compiled {
    /// The rules.
    pub rules: RuleSet,
    stats: Vec<Arc<RuleStats>>,
    /// The files the rules came from.
    pub files: Vec<String>,
    /// When the set was swapped in.
    pub applied_at: UnixMillis,
}

/// The rate limiter: the rules in force, the counters and the clock.
pub struct RateLimiter {
    rules: ArcSwap<Compiled>,
    entities: EntityCache,
    /// Global mode: where entities with news are queued for the background sync.
    sync: Option<Arc<SyncQueues>>,
    clock: Arc<dyn Clock>,
    opts: Options,
    telemetry: Arc<Telemetry>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("entities", &self.entities)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// What a descriptor resolved to.
enum Target<'a> {
    NoRule,
    Rule(&'a Rule, u128, Arc<RuleStats>),
    Override(Rule, u128, Arc<RuleStats>),
}

impl Target<'_> {
    fn rule(&self) -> Option<&Rule> {
        match self {
            Target::NoRule => None,
            Target::Rule(r, ..) => Some(r),
            Target::Override(r, ..) => Some(r),
        }
    }
}

/// The outcome of one descriptor against all of its rule's limits.
struct Outcome {
    over: bool,
    /// The limit reported: the most restrictive one.
    reported: usize,
    verdict: Verdict,
}

// === impl RateLimiter ===

impl RateLimiter {
    /// A limiter with `rules` in force; with `sync`, in global mode.
    pub fn new(
        rules: RuleSet,
        files: Vec<String>,
        clock: Arc<dyn Clock>,
        opts: Options,
        telemetry: Arc<Telemetry>,
        sync: Option<Arc<SyncQueues>>,
    ) -> Arc<Self> {
        let entities = EntityCache::new(opts.cache);
        let compiled = Self::compile_stats(&telemetry, rules, files, clock.now());
        let limiter = Arc::new(RateLimiter {
            rules: ArcSwap::from_pointee(compiled),
            entities,
            sync,
            clock,
            opts,
            telemetry,
        });
        let entities = limiter.entities.clone();
        limiter.telemetry.gauge(
            "sluice_entities",
            "Entities (rule + descriptor values) with counters in memory",
            Arc::new(move || entities.len()),
        );
        limiter
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
        Ok(Self::new(
            rules,
            vec![],
            clock,
            opts,
            Arc::new(telemetry),
            None,
        ))
    }

    fn compile_stats(
        t: &Telemetry,
        rules: RuleSet,
        files: Vec<String>,
        now: UnixMillis,
    ) -> Compiled {
        let stats = rules
            .rules()
            .iter()
            .map(|r| t.rules.get(&r.domain, &r.full_key))
            .collect();
        Compiled {
            rules,
            stats,
            files,
            applied_at: now,
        }
    }

    /// Puts `rules` in force in one atomic step. Counters of unchanged rules carry over,
    /// since counters are keyed by rule identity, not by rule set.
    pub fn swap_rules(&self, rules: RuleSet, files: Vec<String>) {
        let compiled = Self::compile_stats(&self.telemetry, rules, files, self.clock.now());
        self.rules.store(Arc::new(compiled));
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

    fn validate(&self, req: &RateLimitRequest) -> Result<(), RequestError> {
        if req.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if req.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        let o = &self.opts;
        if req.descriptors.len() > o.max_descriptors {
            return Err(RequestError::TooManyDescriptors {
                count: req.descriptors.len(),
                max: o.max_descriptors,
            });
        }
        if req.domain.len() > o.max_value_bytes {
            return Err(RequestError::ValueTooLong {
                index: 0,
                len: req.domain.len(),
                max: o.max_value_bytes,
            });
        }
        for (index, d) in req.descriptors.iter().enumerate() {
            if d.entries.len() > o.max_entries {
                return Err(RequestError::TooManyEntries {
                    index,
                    count: d.entries.len(),
                    max: o.max_entries,
                });
            }
            let len = d
                .entries
                .iter()
                .map(|e| e.key.len().max(e.value.len()))
                .max()
                .unwrap_or(0);
            if len > o.max_value_bytes {
                return Err(RequestError::ValueTooLong {
                    index,
                    len,
                    max: o.max_value_bytes,
                });
            }
            if let Some(l) = &d.limit {
                if !matches!(PbUnit::try_from(l.unit), Ok(u) if u != PbUnit::Unknown) {
                    return Err(RequestError::BadOverrideUnit {
                        index,
                        unit: l.unit,
                    });
                }
            }
        }
        Ok(())
    }

    /// Answers one `ShouldRateLimit` request at the clock's current time.
    ///
    /// # Errors
    /// [`RequestError`] when the request is malformed; nothing is counted then.
    pub fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        let stats = &self.telemetry.service;
        RuleStats::add(&stats.requests, 1);
        if let Err(e) = self.validate(req) {
            RuleStats::add(&stats.invalid_requests, 1);
            return Err(e);
        }
        let now = self.clock.now();
        let compiled = self.rules.load();
        let default_hits = u64::from(req.hits_addend.max(1));

        let mut targets: Vec<Target<'_>> = req
            .descriptors
            .iter()
            .map(|d| self.resolve(&compiled, &req.domain, d))
            .collect();

        // `replaces`: names from every matched limit drop the named limits, for this request.
        let replaced: Vec<&str> = targets
            .iter()
            .filter_map(Target::rule)
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        if !replaced.is_empty() {
            let dropped: Vec<bool> = targets
                .iter()
                .map(|t| {
                    t.rule()
                        .is_some_and(|r| !r.name.is_empty() && replaced.contains(&r.name.as_str()))
                })
                .collect();
            for (t, drop) in targets.iter_mut().zip(dropped) {
                if drop {
                    *t = Target::NoRule;
                }
            }
        }

        let hits: Vec<u64> = req
            .descriptors
            .iter()
            .map(|d| d.hits_addend.map_or(default_hits, |h| h.value))
            .collect();

        // With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, look before counting anything.
        let any_over = self.opts.stop_increment_when_over_limit
            && targets
                .iter()
                .zip(&hits)
                .any(|(t, &h)| self.evaluate(t, now, h, Count::No).is_some_and(|o| o.over));

        let mut statuses = Vec::with_capacity(targets.len());
        let (mut non_quota_over, mut quotas, mut quotas_over) = (false, 0usize, 0usize);
        for (i, t) in targets.iter().enumerate() {
            let (h, negative) = (hits[i], req.descriptors[i].is_negative_hits);
            let count = if negative {
                Count::Refund
            } else {
                Count::Yes {
                    hold_within: any_over,
                }
            };
            let Some(rule) = t.rule() else {
                RuleStats::add(&stats.decisions_no_rule, 1);
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            };
            // Unlimited (and, defensively, a rule without limits): nothing is counted.
            let Some(outcome) = self.evaluate(t, now, h, count) else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                });
                continue;
            };
            let quota = rule.quota_mode || self.opts.quota_mode;
            self.record_stats(t, rule, &outcome, h);
            if outcome.over {
                RuleStats::add(&stats.decisions_over, 1);
            } else {
                RuleStats::add(&stats.decisions_ok, 1);
            }
            let reported_over = outcome.over && !rule.shadow_mode;
            if quota {
                quotas += 1;
                quotas_over += usize::from(reported_over);
            } else {
                non_quota_over |= reported_over;
            }
            let spec = &rule.limits[outcome.reported];
            statuses.push(DescriptorStatus {
                code: if reported_over {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                current_limit: Some(PbRateLimit {
                    name: rule.name.clone(),
                    requests_per_unit: spec.limit.requests_per_unit,
                    unit: pb_unit(spec.unit) as i32,
                }),
                limit_remaining: outcome.verdict.remaining,
                duration_until_reset: Some(PbDuration {
                    seconds: outcome.verdict.reset_ms.div_ceil(1000) as i64,
                    nanos: 0,
                }),
                quota: None,
            });
        }
        let over = non_quota_over || (quotas > 0 && quotas == quotas_over);
        let overall = if over && !self.opts.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let response_headers_to_add = match &self.opts.response_headers {
            Some(names) => headers(names, &statuses, overall == Code::OverLimit),
            None => Vec::new(),
        };
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..Default::default()
        })
    }

    fn resolve<'a>(
        &self,
        compiled: &'a Compiled,
        domain: &str,
        d: &envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
    ) -> Target<'a> {
        let rules = &compiled.rules;
        if let Some(o) = &d.limit {
            if !rules.has_domain(domain) {
                return Target::NoRule;
            }
            // validate() has checked the unit.
            let unit = rule_unit(PbUnit::try_from(o.unit).unwrap_or(PbUnit::Second));
            let mut key = format!("{domain}.");
            for (i, e) in d.entries.iter().enumerate() {
                if i > 0 {
                    key.push('.');
                }
                key.push_str(&e.key);
                if !e.value.is_empty() {
                    key.push('_');
                    key.push_str(&e.value);
                }
            }
            let limit = Limit {
                requests_per_unit: o.requests_per_unit,
                window_ms: unit.seconds() * 1000,
                algorithm: Algorithm::SlidingWindow,
            };
            let mut h = Xxh3::new();
            h.update(b"override\0");
            h.update(key.as_bytes());
            h.update(&o.requests_per_unit.to_le_bytes());
            h.update(&(unit.seconds()).to_le_bytes());
            let stats = self
                .telemetry
                .rules
                .get_detailed(domain, &key)
                .unwrap_or_else(|| {
                    self.telemetry
                        .rules
                        .get(domain, &format!("{domain}.override"))
                });
            let rule = Rule {
                id: 0,
                domain: domain.to_string(),
                full_key: key,
                name: String::new(),
                limits: vec![LimitSpec { limit, unit }],
                unlimited: false,
                shadow_mode: false,
                quota_mode: false,
                detailed_metric: false,
                value_to_metric: false,
                replaces: Vec::new(),
            };
            return Target::Override(rule, h.digest128(), stats);
        }
        match rules.find(domain, &d.entries) {
            None => Target::NoRule,
            Some(m) => {
                let stats = rules
                    .metric_key(&m, &d.entries)
                    .and_then(|k| self.telemetry.rules.get_detailed(domain, &k))
                    .unwrap_or_else(|| compiled.stats[m.index].clone());
                Target::Rule(m.rule, m.entity, stats)
            }
        }
    }

    /// Checks (and, per `count`, counts) `hits` against every limit of the target's rule.
    /// `None` for targets that are not counted (no rule, unlimited).
    fn evaluate(
        &self,
        t: &Target<'_>,
        now: UnixMillis,
        hits: u64,
        count: Count,
    ) -> Option<Outcome> {
        let (rule, entity) = match t {
            Target::NoRule => return None,
            Target::Rule(r, e, _) => (*r, *e),
            Target::Override(r, e, _) => (r, *e),
        };
        if rule.unlimited {
            return None;
        }
        let (entity, hit) = self
            .entities
            .get_or_create(entity, || rule.limits.iter().map(|l| l.limit).collect());
        let stats = &self.telemetry.service;
        RuleStats::add(
            if hit {
                &stats.cache_hits
            } else {
                &stats.cache_misses
            },
            1,
        );

        let mut guard = entity.state.lock();
        let windows = &mut guard.windows;
        let check_hits = if matches!(count, Count::Refund) {
            0
        } else {
            hits
        };
        let mut outcome: Option<Outcome> = None;
        for (i, spec) in rule.limits.iter().enumerate() {
            let v = windows[i].check(&spec.limit, now, check_hits);
            let better = match &outcome {
                None => true,
                // Over beats within; then fewer hits left; then the later reset.
                Some(o) => {
                    (v.over, std::cmp::Reverse(v.remaining), v.reset_ms)
                        > (
                            o.verdict.over,
                            std::cmp::Reverse(o.verdict.remaining),
                            o.verdict.reset_ms,
                        )
                }
            };
            let over = v.over || outcome.as_ref().is_some_and(|o| o.over);
            if better {
                outcome = Some(Outcome {
                    over,
                    reported: i,
                    verdict: v,
                });
            } else if let Some(o) = &mut outcome {
                o.over = over;
            }
        }
        let outcome = outcome?;
        match count {
            Count::No => {}
            Count::Refund => {
                for (i, spec) in rule.limits.iter().enumerate() {
                    windows[i].refund(&spec.limit, now, hits);
                }
            }
            Count::Yes { hold_within } => {
                if !hold_within || outcome.over {
                    for (i, spec) in rule.limits.iter().enumerate() {
                        windows[i].record(&spec.limit, now, hits, !outcome.over);
                    }
                }
            }
        }
        // Global mode: any look at an entity is news worth a sync (a count to send, or a
        // first read of the fleet's count); a queued entity costs nothing more here.
        if let Some(q) = &self.sync {
            q.mark_dirty(&entity, &mut guard);
        }
        Some(outcome)
    }

    fn record_stats(&self, t: &Target<'_>, rule: &Rule, o: &Outcome, hits: u64) {
        let s = match t {
            Target::Rule(_, _, s) | Target::Override(_, _, s) => s,
            Target::NoRule => return,
        };
        RuleStats::add(&s.total_hits, hits);
        if o.over {
            RuleStats::add(&s.over_limit, hits);
            if rule.shadow_mode || self.opts.shadow_mode {
                RuleStats::add(&s.shadow_mode, hits);
            }
        } else {
            RuleStats::add(&s.within_limit, hits);
            let limit = rule.limits[o.reported].limit.requests_per_unit;
            let near = (f64::from(limit) * self.opts.near_limit_ratio).floor() as u64;
            if o.verdict.count_after > near {
                RuleStats::add(&s.near_limit, hits);
            }
        }
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

#[derive(Debug, Clone, Copy)]
enum Count {
    /// Look only.
    No,
    /// Count; with `hold_within`, descriptors within their limits are not counted.
    Yes { hold_within: bool },
    /// Give hits back (`is_negative_hits`).
    Refund,
}

fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn rule_unit(u: PbUnit) -> Unit {
    match u {
        PbUnit::Unknown | PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
    }
}

/// The rate-limit headers from the most restrictive limited descriptor: an over-limit one
/// wins, else the one with the fewest hits left. `Retry-After` is added when the request is
/// refused.
fn headers(names: &HeaderNames, statuses: &[DescriptorStatus], refused: bool) -> Vec<HeaderValue> {
    let reset = |s: &DescriptorStatus| s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    let Some(pick) = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .max_by_key(|s| {
            (
                s.code == Code::OverLimit as i32,
                std::cmp::Reverse(s.limit_remaining),
                reset(s),
            )
        })
    else {
        return Vec::new();
    };
    let limit = pick
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let header = |k: &str, v: String| HeaderValue {
        key: k.to_string(),
        value: v,
        ..Default::default()
    };
    let mut out = vec![
        header(&names.limit, limit.to_string()),
        header(&names.remaining, pick.limit_remaining.to_string()),
        header(&names.reset, reset(pick).to_string()),
    ];
    if refused {
        out.push(header("Retry-After", reset(pick).to_string()));
    }
    out
}
