//! Step 2 of a request: each descriptor to its target (a rule and the entity counting for it,
//! a request-supplied limit override, or nothing), then `replaces` across the request. A
//! function of the rules in force and the rules' metric series, which is all it is handed.

use std::borrow::Cow;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::Compiled;
use crate::core::table::RuleCounts;
use crate::core::{Algorithm, Limit};
use crate::rules::identity;
use crate::rules::{LimitSpec, Rule};
use crate::telemetry::{RuleStats, RuleStatsRegistry};

/// What a descriptor resolved to: a rule of the rule set comes with its per-rule counts
/// (`core/table/counts.rs`), looked up when the rules were compiled.
pub(super) enum Target<'a> {
    NoRule,
    Rule(&'a Rule, u128, Arc<RuleStats>, Option<&'a RuleCounts>),
    Override(Rule, u128, Arc<RuleStats>),
}

impl Target<'_> {
    pub(super) fn rule(&self) -> Option<&Rule> {
        match self {
            Target::NoRule => None,
            Target::Rule(r, ..) => Some(r),
            Target::Override(r, ..) => Some(r),
        }
    }

    /// The id of its policy in the IETF fields: the rule's `name`, else its path as metrics
    /// name it (`domain.key_value.key2`); a limit override's is `<domain>.override`, since
    /// its path holds the request's own values.
    pub(super) fn policy_id(&self) -> Cow<'_, str> {
        match self {
            Target::Rule(r, ..) if !r.name.is_empty() => Cow::Borrowed(&r.name),
            Target::Rule(r, ..) => Cow::Borrowed(&r.full_key),
            Target::Override(r, ..) => Cow::Owned(format!("{}.override", r.domain)),
            Target::NoRule => Cow::Borrowed(""),
        }
    }
}

/// Every descriptor's target in `compiled`, its series from `series` when the rule makes
/// them per value, with the limits `replaces` names dropped (for this request only: their
/// counters are untouched).
pub(super) fn resolve_all<'a>(
    compiled: &'a Compiled,
    series: &RuleStatsRegistry,
    req: &RateLimitRequest,
) -> Vec<Target<'a>> {
    let mut targets: Vec<Target<'a>> = req
        .descriptors
        .iter()
        .map(|d| resolve(compiled, series, &req.domain, d))
        .collect();
    if !targets
        .iter()
        .filter_map(Target::rule)
        .any(|r| !r.replaces.is_empty())
    {
        return targets;
    }
    let dropped: Vec<bool> = replaced_by(&targets).iter().map(Option::is_some).collect();
    for (t, drop) in targets.iter_mut().zip(dropped) {
        if drop {
            *t = Target::NoRule;
        }
    }
    targets
}

/// One descriptor's target (`replaces` aside).
pub(super) fn resolve<'a>(
    compiled: &'a Compiled,
    series: &RuleStatsRegistry,
    domain: &str,
    d: &RateLimitDescriptor,
) -> Target<'a> {
    let rules = &compiled.rules;
    if let Some(o) = &d.limit {
        if !rules.has_domain(domain) {
            return Target::NoRule;
        }
        let (rule, entity) = request_override(domain, d, o);
        // A series of its own while there is room (its name cut to METRICS_MAX_KEY_BYTES),
        // else the domain's `override` series: every hit is counted somewhere.
        let owner = format!("{domain}.override");
        let stats = series
            .get_client(domain, &rule.full_key, &owner)
            .unwrap_or_else(|| series.get(domain, &owner));
        return Target::Override(rule, entity, stats);
    }
    match rules.find(domain, &d.entries) {
        None => Target::NoRule,
        Some(m) => {
            // detailed_metric/value_to_metric: a client-made series while there is
            // room, else the rule's own.
            let stats = rules
                .metric_key(&m, &d.entries)
                .and_then(|k| series.get_client(domain, &k, &m.rule.full_key))
                .unwrap_or_else(|| compiled.stats[m.index].clone());
            let counts = compiled.counts.get(m.index).map(|c| &**c);
            Target::Rule(m.rule, m.entity, stats, counts)
        }
    }
}

/// Per target, the `full_key` of the rule in the request whose `replaces` names its rule's
/// `name` (the first one), if any: that target counts nothing in this request.
pub(super) fn replaced_by<'t>(targets: &'t [Target<'_>]) -> Vec<Option<&'t str>> {
    let by_name = |name: &str| {
        targets
            .iter()
            .filter_map(Target::rule)
            .find(|r| r.replaces.iter().any(|n| n == name))
            .map(|r| r.full_key.as_str())
    };
    targets
        .iter()
        .map(|t| {
            t.rule()
                .filter(|r| !r.name.is_empty())
                .and_then(|r| by_name(&r.name))
        })
        .collect()
}

/// The rule of a limit the request supplies (`d.limit`, for `domain`, which has rules) and
/// its entity: its path holds the request's own values (`domain.key_value.key2`).
pub(super) fn request_override(
    domain: &str,
    d: &RateLimitDescriptor,
    o: &RateLimitOverride,
) -> (Rule, u128) {
    // validate() has checked the unit.
    let unit = super::unit::from_pb(PbUnit::try_from(o.unit).unwrap_or(PbUnit::Second));
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
    let rule = Rule {
        id: 0,
        domain: domain.to_string(),
        full_key: key,
        name: String::new(),
        limits: vec![LimitSpec {
            limit,
            unit,
            strict: true,
        }],
        unlimited: false,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        replaces: Vec::new(),
        exact: false,
        metadata: None,
        override_of: None,
    };
    let entity = identity::override_entity(&rule.full_key, o.requests_per_unit, unit.seconds());
    (rule, entity)
}
