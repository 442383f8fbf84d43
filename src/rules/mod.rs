//! The compiled, immutable rule set: validation of parsed rules files, the descriptor tree and
//! matching a request descriptor to the rule that applies. Pure: no I/O, no clock.
//!
//! Matching follows envoyproxy/ratelimit: per request entry, greedy and without backtracking,
//! an exact `key`+`value` node wins, then the level's wildcard patterns in file order (`*`
//! matches zero or more characters anywhere in the value), then the key-only node. A limit
//! applies only when the node matched at the request's *last* entry has one. There, a value
//! that a key-only or wildcard node of the level names in its `overrides` is found first, in
//! a hash map, as an exact value would be: an override is its value's own rule.
//!
//! Counter identity ([`Match::entity`]) is a 128-bit hash of the rule's stable id and of the
//! request values at key-only and wildcard levels (one counter per distinct value, unless the
//! node says `share_threshold`). The rule id hashes the rule's path and limits, not its
//! position in the file, so a reload keeps the counters of every unchanged rule. Both are
//! explicit byte encodings, pinned by tests: see `identity.rs`. An override's counter is the
//! one a descriptor for its value alone would have.
//!
//! Files: `model/` (the YAML model and its key check), `prescan.rs` (size and nesting bounds
//! checked before parsing), `documents.rs` (the first YAML document of a file, and the
//! warning for the others), `error.rs` (a rules file's error as printed, and giving errors
//! their lines), `locate.rs` (the line and column of a node in the text), `hints.rs` (the
//! likely cause of a YAML error, the key an unknown one misspells), `compile/` (validation,
//! compilation), `tree/` (the descriptor tree and wildcard matching), `identity.rs` (rule
//! ids and entity keys), `origin.rs` (where each rule was written, its line found on demand),
//! `miss.rs` (why a descriptor matched no rule).

use std::fmt::Write as _;

mod bucket;
mod compile;
mod documents;
pub mod error;
mod hints;
pub mod identity;
pub mod locate;
mod miss;
pub mod model;
mod origin;
pub mod prescan;
mod tree;

pub use bucket::{MAX_BUCKET_ENTRIES, MAX_BUCKET_LOOKUPS};
pub use compile::{
    compile_sources, compile_sources_with, with_prior_errors, CompileOptions, MAX_OVERRIDES,
    MAX_OVERRIDES_PER_RULE,
};
pub use miss::Miss;
pub use origin::{Source, XDS_PREFIX};
pub use tree::MAX_WILDCARD_CHECKS;

use crate::core::{Algorithm, Limit};
use error::ConfigError;
use identity::EntityKey;
use origin::Origin;
use tree::{KeyLevel, Kind, Node};

/// The window unit of a limit, as in the RLS proto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3600 seconds.
    Hour,
    /// 86400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit names a rules file may use, shortest window first.
    pub const VALID: [&'static str; 7] =
        ["second", "minute", "hour", "day", "week", "month", "year"];

    /// Parses a unit name, case-insensitively.
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The proto enum name (`SECOND`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// One limit of a rule with the unit it is reported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    /// What the limiter enforces.
    pub limit: Limit,
    /// The unit reported to Envoy in `current_limit`.
    pub unit: Unit,
    /// Whether a denied request's hits are counted (`strict`, default true: the reference's
    /// `INCRBY` of every hit). Not part of the rule id: it changes what is counted, not
    /// which counter.
    pub strict: bool,
}

/// A compiled rule: what applies when a descriptor matches a node with a `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Stable identity: a hash of the rule's path and its limits (`identity::rule_id`).
    pub id: u64,
    /// The domain the rule belongs to.
    pub domain: String,
    /// The reference's stats key: `domain.key_value.key2`, also the rule path in metrics.
    pub full_key: String,
    /// The `rate_limit.name`, used by `replaces`.
    pub name: String,
    /// The limits enforced together; empty when unlimited.
    pub limits: Vec<LimitSpec>,
    /// Never counted or denied.
    pub unlimited: bool,
    /// Over-limit statuses are reported as OK.
    pub shadow_mode: bool,
    /// The descriptor is a quota: see docs/wire.md, on the overall code.
    pub quota_mode: bool,
    /// Metrics keyed by the request's actual values.
    pub detailed_metric: bool,
    /// Some level of the rule's path puts its actual value into metrics.
    pub value_to_metric: bool,
    /// Names of limits dropped when this rule matches in the same request.
    pub replaces: Vec<String>,
    /// `exact: true`: in global mode every hit is decided against Redis, atomically
    /// (docs/global.md, "Exact rules"); in local mode it changes nothing.
    pub exact: bool,
    /// The descriptor's free-form `metadata`, for `RESPONSE_DYNAMIC_METADATA`.
    pub metadata: Option<std::sync::Arc<serde_yaml::Value>>,
    /// For a rule compiled from one of a rule's `overrides`, that rule's `full_key`: its
    /// metric series when `METRICS_OVERRIDE_SERIES` is off.
    pub override_of: Option<String>,
}

impl Rule {
    /// Whether every limit's unit is second: with `REDIS_PERSECOND` its counters live in the
    /// per-second Redis (the reference's `PerSecond` cache keys). A rule that mixes seconds
    /// with longer units stays in the main Redis, so that an entity's counters are in one
    /// place.
    pub fn per_second(&self) -> bool {
        !self.limits.is_empty() && self.limits.iter().all(|l| l.unit == Unit::Second)
    }
}

/// A request entry, as matching needs it. Implemented for the proto entry by the service.
pub trait EntryRef {
    /// The entry's key.
    fn key(&self) -> &str;
    /// The entry's value.
    fn value(&self) -> &str;
}

impl EntryRef for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

/// The rule a descriptor matched and the counter it uses.
#[derive(Debug, Clone, Copy)]
pub struct Match<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The rule's index in [`RuleSet::rules`].
    pub index: usize,
    /// The counter's identity (see the module docs).
    pub entity: u128,
}

/// A walk down one domain's tree: the level it has reached and the counter key so far.
/// [`RuleSet::find`] walks in the descriptor's order; [`RuleSet::find_bucket`] searches for
/// the order, cloning the walk at each branch. Both step through here, so a bucket and the
/// equivalent descriptor select the same nodes and count in the same counter.
#[derive(Debug, Clone)]
struct Walk<'s> {
    level: &'s tree::Map<KeyLevel>,
    key: EntityKey,
}

// === impl Walk ===

impl<'s> Walk<'s> {
    /// The node the entry `key: value` selects at this level: none if the level does not
    /// name `key`; else the exact value, the first wildcard that matches, or the key-only
    /// node, in that order.
    fn select(&self, key: &str, value: &str) -> Option<&'s Node> {
        self.level.get(key)?.lookup(value)
    }

    /// Goes down into `node`, which `value` selected. A key-only or wildcard node counts one
    /// counter per value (unless it shares one), so the value joins the entity key.
    fn enter(&mut self, node: &'s Node, value: &str) {
        if node.kind != Kind::Exact && !node.share_threshold {
            self.key.value(value);
        }
        self.level = &node.children;
    }
}

/// The compiled rules of every domain. Immutable; replaced whole on reload.
#[derive(Debug, Default)]
pub struct RuleSet {
    domains: tree::Map<tree::Map<KeyLevel>>,
    rules: Vec<Rule>,
    /// Where each rule was written, in the order of `rules` (`origin.rs`).
    origins: Vec<Origin>,
    /// The texts of the files the rules were compiled from, when they had any (not over
    /// xDS): each rule's line is found in them on demand ([`RuleSet::source`]).
    texts: Vec<(std::sync::Arc<str>, std::sync::Arc<str>)>,
    /// What the files' parse let pass but named ([`RuleSet::warnings`]).
    warnings: Vec<ConfigError>,
}

// === impl RuleSet ===

impl RuleSet {
    /// Whether `domain` has rules (a limit override applies only to known domains).
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// How many domains have rules.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Every compiled rule, in load order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// What the rules files held that the reference lets pass and so does sluice, but that
    /// is likely a slip, each with its file and line: a key of the reference's out of place
    /// (ignored), a YAML document after the first (never read). `sluice check` prints them,
    /// and a load logs them.
    pub fn warnings(&self) -> &[ConfigError] {
        &self.warnings
    }

    /// Makes every rule each of whose limits holds fewer than `below` hits (a window's
    /// `requests_per_unit`, a bucket's burst, a concurrency limit's places) an exact one, as
    /// `exact: true` would; the number of rules it made so. `unlimited` rules and those
    /// already exact are left as they are.
    pub fn decide_exactly_below(&mut self, below: u32) -> usize {
        let mut made = 0;
        for r in &mut self.rules {
            let small = !r.limits.is_empty() && r.limits.iter().all(|l| l.limit.capacity() < below);
            if small && !r.unlimited && !r.exact {
                r.exact = true;
                made += 1;
            }
        }
        made
    }

    /// Whether any rule says `exact: true` (else a request never needs the exact path).
    pub fn has_exact(&self) -> bool {
        self.rules.iter().any(|r| r.exact)
    }

    /// The rule that applies to a descriptor, if any. Allocation-free.
    pub fn find<E: EntryRef>(&self, domain: &str, entries: &[E]) -> Option<Match<'_>> {
        let (last, path) = entries.split_last()?;
        let mut walk = self.walk(domain)?;
        for entry in path {
            let node = walk.select(entry.key(), entry.value())?;
            walk.enter(node, entry.value());
        }
        self.matched(walk, last.key(), last.value())
    }

    /// A walk from the top of `domain`'s tree, if the domain has rules.
    fn walk(&self, domain: &str) -> Option<Walk<'_>> {
        Some(Walk {
            level: self.domains.get(domain)?,
            key: EntityKey::new(),
        })
    }

    /// The match of a walk at the descriptor's last entry, `key: value` (a limit applies
    /// only there): the value's override, as an exact value's rule would be (its counter
    /// without the value, which its rule names); else the rule of the node the entry
    /// selects, if it has one, and the counter of the walk's values and this one's.
    fn matched(&self, mut walk: Walk<'_>, key: &str, value: &str) -> Option<Match<'_>> {
        let level = walk.level.get(key)?;
        let index = match level.overrides.get(value) {
            Some(&index) => index,
            None => {
                let node = level.lookup(value)?;
                walk.enter(node, value);
                node.rule?
            }
        };
        let rule = &self.rules[index];
        Some(Match {
            rule,
            index,
            entity: walk.key.finish(rule.id),
        })
    }

    /// The metrics key of a match whose rule asks for values in metrics
    /// (`detailed_metric` or `value_to_metric`); `None` when the rule's own key is used.
    pub fn metric_key<E: EntryRef>(&self, m: &Match<'_>, entries: &[E]) -> Option<String> {
        let rule = m.rule;
        if !rule.detailed_metric && !rule.value_to_metric {
            return None;
        }
        let mut key = format!("{}.", rule.domain);
        let mut level = self.domains.get(&rule.domain)?;
        for (i, entry) in entries.iter().enumerate() {
            if i > 0 {
                key.push('.');
            }
            let key_level = level.get(entry.key())?;
            if i + 1 == entries.len() && key_level.overrides.contains_key(entry.value()) {
                // An override is its value's own rule: `key_value`, as an exact value's.
                let _ = write!(key, "{}_{}", entry.key(), entry.value());
                break;
            }
            let node = key_level.lookup(entry.value())?;
            // A shared counter is reported under its pattern, as the reference does.
            let with_value = !node.share_threshold
                && (rule.detailed_metric || (node.value_to_metric && node.kind != Kind::Exact));
            if with_value && !entry.value().is_empty() {
                let _ = write!(key, "{}_{}", entry.key(), entry.value());
            } else {
                key.push_str(&node.final_key);
            }
            level = &node.children;
        }
        Some(key)
    }

    /// One line per rule, as `/rlconfig` shows it.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for r in &self.rules {
            if r.unlimited {
                let _ = write!(out, "{}: unlimited", r.full_key);
            } else {
                let _ = write!(out, "{}:", r.full_key);
                for (i, l) in r.limits.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    let window = l.limit.window_ms / 1000 / l.unit.seconds();
                    let _ = write!(
                        out,
                        "{sep} unit={} requests_per_unit={}",
                        l.unit.name(),
                        l.limit.requests_per_unit
                    );
                    if window != 1 {
                        let _ = write!(out, " unit_multiplier={window}");
                    }
                    match l.limit.algorithm {
                        Algorithm::FixedWindow => out.push_str(" algorithm=fixed_window"),
                        Algorithm::TokenBucket { burst } => {
                            let _ = write!(out, " algorithm=token_bucket burst={burst}");
                        }
                        Algorithm::Concurrency => out.push_str(" algorithm=concurrency"),
                        Algorithm::SlidingWindow => {}
                    }
                    // Shown when not the algorithm's default (buckets are lenient unless
                    // told; concurrency limits always are).
                    let lenient_default = matches!(
                        l.limit.algorithm,
                        Algorithm::TokenBucket { .. } | Algorithm::Concurrency
                    );
                    if l.strict == lenient_default {
                        let _ = write!(out, " strict={}", l.strict);
                    }
                }
            }
            let _ = write!(
                out,
                ", shadow_mode: {}, quota_mode: {}",
                r.shadow_mode, r.quota_mode
            );
            if !r.name.is_empty() {
                let _ = write!(out, ", name: {}", r.name);
            }
            // Shown only when set, so other lines keep the reference's form.
            if r.exact {
                out.push_str(", exact: true");
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests;
