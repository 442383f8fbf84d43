//! Who is near a limit (`GET /top`, [`top`], which [`RateLimiter::top`] hands the rules in
//! force, the table and the fleet's view) and each rule's limit as metrics (`sluice_rule_*`,
//! [`register_rule_gauges`]).
//!
//! `/top` ranks no table scan: each rule keeps at most [`MAX_CANDIDATES`] candidates (the
//! keys that climbed highest this period, `core/table/counts.rs`); an answer re-reads each
//! candidate's entity as `/explain` does (`explain.rs`, [`look_on`]: the count as this
//! replica sees the fleet's, its recency untouched), ranks them by count ÷ limit and keeps
//! the first `n`. Candidates whose entity has left the table drop out then. At most
//! [`TOP_READ_BUDGET`] candidates are read per answer, whatever the number of rules.
//!
//! The gauges are O(rules) per scrape: a rule's limit and unit, and its counts, which the
//! table and the request path keep up to date without a scan.

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use opentelemetry::KeyValue;
use serde::Serialize;

use super::explain::{look_on, EntryJson};
use super::{Compiled, RateLimiter};
use crate::core::clock::UnixMillis;
use crate::core::table::{period_of, EntityTable, RuleCounts, MAX_CANDIDATES};
use crate::core::{FleetView, LimitState};
use crate::rules::{LimitSpec, Rule, RuleSet, Unit};
use crate::telemetry::{names, Telemetry};

/// The most keys `GET /top` answers (`n`).
pub const MAX_TOP: usize = MAX_CANDIDATES;

/// The most candidates one `/top` answer re-reads (each a lookup under its shard's lock):
/// a hundred rules' worth of full candidate lists.
pub const TOP_READ_BUDGET: usize = 100 * MAX_CANDIDATES;

/// `GET /top`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct TopKeys {
    /// The keys, highest ratio first.
    pub keys: Vec<TopKey>,
}

/// One key near (or past) its limit.
#[derive(Debug, Clone, Serialize)]
pub struct TopKey {
    /// The rule's domain.
    pub domain: String,
    /// The rule's path (`domain.key_value.key2`), as metrics name it.
    pub rule: String,
    /// The rule's `name` (empty when unnamed).
    pub name: String,
    /// The descriptor's entries.
    pub entries: Vec<EntryJson>,
    /// The count as this replica sees the fleet's (a bucket: tokens in use), on the limit
    /// nearest to its end.
    pub count: u64,
    /// That limit: `requests_per_unit` (a bucket: its burst).
    pub limit: u32,
    /// Its unit (`second` ... `year`).
    pub unit: &'static str,
    /// `count / limit`.
    pub ratio: f64,
    /// Seconds until its window ends (a bucket: until it is full).
    pub reset_seconds: u64,
}

/// What `/top` asks for.
#[derive(Debug, Clone, Copy)]
pub struct TopQuery<'a> {
    /// Only this domain's rules.
    pub domain: Option<&'a str>,
    /// Only the rule with this path (`full_key`) or `name`.
    pub rule: Option<&'a str>,
    /// How many keys, 1..=[`MAX_TOP`].
    pub n: usize,
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Second => "second",
        Unit::Minute => "minute",
        Unit::Hour => "hour",
        Unit::Day => "day",
        Unit::Week => "week",
        Unit::Month => "month",
        Unit::Year => "year",
    }
}

/// The `q.n` keys with the highest count ÷ limit at `now` among the rules of `compiled`
/// that `q` selects, highest first (ties: the higher count, then by rule and entries), each
/// re-read in `table` as this replica sees the fleet's count (`fleet`). Counts nothing.
pub(super) fn top(
    compiled: &Compiled,
    table: &EntityTable,
    fleet: &FleetView,
    now: UnixMillis,
    q: TopQuery<'_>,
) -> TopKeys {
    let mut budget = TOP_READ_BUDGET;
    let mut keys = Vec::new();
    for (rule, counts) in compiled.rules.rules().iter().zip(&compiled.counts) {
        let wanted = q.domain.is_none_or(|d| d == rule.domain)
            && q.rule
                .is_none_or(|r| r == rule.full_key || (!rule.name.is_empty() && r == rule.name));
        if !wanted || rule.unlimited || budget == 0 {
            continue;
        }
        let mut candidates = counts.candidates.snapshot();
        candidates.truncate(budget);
        budget -= candidates.len();
        let mut gone = HashSet::new();
        for c in candidates {
            let held = table.get(c.key, |e| e.state.states.to_vec());
            let Some(held) = held else {
                gone.insert(c.key);
                continue;
            };
            if let Some(key) = top_key(rule, held, now, &c.entries, fleet) {
                keys.push(key);
            }
        }
        if !gone.is_empty() {
            counts.candidates.forget(|k| gone.contains(&k));
        }
    }
    keys.sort_by(|a, b| {
        (b.ratio.total_cmp(&a.ratio))
            .then(b.count.cmp(&a.count))
            .then_with(|| (&a.domain, &a.rule).cmp(&(&b.domain, &b.rule)))
            .then_with(|| entries_key(a).cmp(&entries_key(b)))
    });
    keys.truncate(q.n.min(MAX_TOP));
    TopKeys { keys }
}

/// A candidate as it stands: its limit nearest to its end; `None` when it counts nothing
/// now (its window passed, its bucket full).
fn top_key(
    rule: &Rule,
    held: Vec<LimitState>,
    now: UnixMillis,
    entries: &[(Box<str>, Box<str>)],
    fleet: &FleetView,
) -> Option<TopKey> {
    let looks = look_on(rule, Some(held), now, 0, fleet)?;
    let (spec, standing) = (rule.limits.iter().zip(looks.iter().map(|(s, _)| s)))
        .max_by(|(a, sa), (b, sb)| ratio(a, sa).total_cmp(&ratio(b, sb)))?;
    if standing.count_after == 0 {
        return None;
    }
    Some(TopKey {
        domain: rule.domain.clone(),
        rule: rule.full_key.clone(),
        name: rule.name.clone(),
        entries: (entries.iter())
            .map(|(k, v)| EntryJson {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        count: standing.count_after,
        limit: spec.limit.capacity(),
        unit: unit_name(spec.unit),
        ratio: ratio(spec, standing),
        reset_seconds: standing.reset_ms.div_ceil(1000),
    })
}

/// Registers the per-rule gauges (`sluice_rule_*`), read at scrape time from the rules in
/// force of `limiter`: O(rules), whatever the number of keys. Holds the limiter weakly (it
/// owns the telemetry).
pub(super) fn register_rule_gauges(limiter: &Arc<RateLimiter>, telemetry: &Telemetry) {
    type Read = fn(&Rule, &RuleCounts, u32) -> u64;
    let gauges: [(_, Read); 5] = [
        (names::RULE_LIMIT, |r, _, _| {
            u64::from(r.limits[0].limit.requests_per_unit)
        }),
        (names::RULE_UNIT_SECONDS, |r, _, _| {
            r.limits[0].limit.window_ms / 1000
        }),
        (names::RULE_TRACKED_KEYS, |_, c, _| c.tracked()),
        (names::RULE_NEAR_LIMIT_KEYS, |_, c, p| c.near(p)),
        (names::RULE_OVER_LIMIT_KEYS, |_, c, p| c.over(p)),
    ];
    for (metric, read) in gauges {
        let weak: Weak<RateLimiter> = Arc::downgrade(limiter);
        telemetry.labelled_gauge(
            metric,
            Arc::new(move || {
                let Some(limiter) = weak.upgrade() else {
                    return Vec::new();
                };
                let now = limiter.clock.now().0;
                rule_series(&limiter.rules.load(), |r, c| {
                    read(r, c, period_of(now, r.limits[0].limit.window_ms))
                })
            }),
        );
    }
}

/// Each rule's counts in `table`, in rule order: looked up once per rule when rules are
/// compiled, so that a request finds its rule's beside its metric handles.
pub(super) fn counts_of(table: &EntityTable, rules: &RuleSet) -> Vec<Arc<RuleCounts>> {
    (rules.rules().iter())
        .map(|r| {
            let limits: Vec<_> = r.limits.iter().map(|l| l.limit).collect();
            table.rule_counts(r.id, &limits)
        })
        .collect()
}

/// Drops the `/top` candidates of the rules `old` had and `new` has not: their bytes go
/// back to the budget at once (their counts stay in the table until a sweep finds no record
/// of them left, `core/table/release.rs`).
pub(super) fn forget_removed(old: &Compiled, new: &Compiled) {
    let kept: HashSet<*const RuleCounts> = new.counts.iter().map(Arc::as_ptr).collect();
    for c in old
        .counts
        .iter()
        .filter(|c| !kept.contains(&Arc::as_ptr(c)))
    {
        c.candidates.forget(|_| true);
    }
}

/// One series per limited rule in force, labelled as the per-rule counters are.
fn rule_series(
    compiled: &Compiled,
    read: impl Fn(&Rule, &RuleCounts) -> u64,
) -> Vec<(u64, Vec<KeyValue>)> {
    (compiled.rules.rules().iter().zip(&compiled.counts))
        .filter(|(r, _)| !r.unlimited && !r.limits.is_empty())
        .map(|(r, c)| {
            let labels = vec![
                KeyValue::new("domain", r.domain.clone()),
                KeyValue::new("rule", r.full_key.clone()),
            ];
            (read(r, c), labels)
        })
        .collect()
}

fn ratio(spec: &LimitSpec, v: &crate::core::Verdict) -> f64 {
    v.count_after as f64 / f64::from(spec.limit.capacity().max(1))
}

fn entries_key(k: &TopKey) -> Vec<(&str, &str)> {
    (k.entries.iter())
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect()
}
