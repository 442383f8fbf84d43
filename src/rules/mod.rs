//! The compiled, immutable rule set: validation of parsed rules files, the descriptor tree and
//! matching a request descriptor to the rule that applies. Pure: no I/O, no clock.
//!
//! Matching follows envoyproxy/ratelimit: per request entry, greedy and without backtracking,
//! an exact `key`+`value` node wins, then the level's wildcard patterns in file order (`*`
//! matches zero or more characters anywhere in the value), then the key-only node. A limit
//! applies only when the node matched at the request's *last* entry has one.
//!
//! Counter identity ([`Match::entity`]) is a 128-bit hash of the rule's stable id and of the
//! request values at key-only and wildcard levels (one counter per distinct value, unless the
//! node says `share_threshold`). The rule id hashes the rule's path and limits, not its
//! position in the file, so a reload keeps the counters of every unchanged rule.

use std::collections::HashMap;
use std::fmt::Write as _;

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

pub mod model;

use crate::core::{Algorithm, Limit};
use model::{ConfigError, DescriptorConfig, LimitConfig, RulesFile};

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
}

/// A compiled rule: what applies when a descriptor matches a node with a `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Stable identity: a hash of the domain, the rule's path and its limits.
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
    /// The descriptor is a quota: see DESIGN §1 on the overall code.
    pub quota_mode: bool,
    /// Metrics keyed by the request's actual values.
    pub detailed_metric: bool,
    /// Some level of the rule's path puts its actual value into metrics.
    pub value_to_metric: bool,
    /// Names of limits dropped when this rule matches in the same request.
    pub replaces: Vec<String>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exact,
    Wildcard,
    AnyValue,
}

#[derive(Debug)]
struct Node {
    kind: Kind,
    /// `key` or `key_value`, the reference's composite key part.
    final_key: String,
    rule: Option<usize>,
    share_threshold: bool,
    value_to_metric: bool,
    children: HashMap<String, KeyLevel>,
}

#[derive(Debug, Default)]
struct KeyLevel {
    exact: HashMap<String, Node>,
    wildcards: Vec<(String, Node)>,
    any_value: Option<Box<Node>>,
}

impl KeyLevel {
    fn lookup(&self, value: &str) -> Option<&Node> {
        self.exact
            .get(value)
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|(p, _)| wildcard_match(p.as_bytes(), value.as_bytes()))
                    .map(|(_, n)| n)
            })
            .or(self.any_value.as_deref())
    }
}

/// The compiled rules of every domain. Immutable; replaced whole on reload.
#[derive(Debug, Default)]
pub struct RuleSet {
    domains: HashMap<String, HashMap<String, KeyLevel>>,
    rules: Vec<Rule>,
}

// === impl RuleSet ===

impl RuleSet {
    /// Validates and compiles parsed files (name, content). With `merge_domains`, files that
    /// share a domain are merged; otherwise a domain may appear in one file only.
    ///
    /// # Errors
    /// Every problem found in every file; nothing is compiled when there is one.
    pub fn compile(
        files: &[(String, RulesFile)],
        merge_domains: bool,
    ) -> Result<RuleSet, Vec<ConfigError>> {
        let mut set = RuleSet::default();
        let mut errors = Vec::new();
        for (name, file) in files {
            if file.domain.is_empty() {
                errors.push(ConfigError::new(
                    name,
                    "config file cannot have empty domain",
                ));
                continue;
            }
            if set.domains.contains_key(&file.domain) && !merge_domains {
                errors.push(ConfigError::new(
                    name,
                    format!("duplicate domain '{}' in config file", file.domain),
                ));
                continue;
            }
            let mut root = set.domains.remove(&file.domain).unwrap_or_default();
            let mut cx = Compiler {
                file: name,
                domain: &file.domain,
                rules: &mut set.rules,
                errors: &mut errors,
            };
            cx.load(
                &mut root,
                &format!("{}.", file.domain),
                &file.descriptors,
                false,
            );
            set.domains.insert(file.domain.clone(), root);
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(errors)
        }
    }

    /// Whether `domain` has rules (a limit override applies only to known domains).
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Every compiled rule, in load order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule that applies to a descriptor, if any. Allocation-free.
    pub fn find<E: EntryRef>(&self, domain: &str, entries: &[E]) -> Option<Match<'_>> {
        let mut level = self.domains.get(domain)?;
        let mut hasher = Xxh3::new();
        for (i, entry) in entries.iter().enumerate() {
            let node = level.get(entry.key())?.lookup(entry.value())?;
            if node.kind != Kind::Exact && !node.share_threshold {
                // Length-prefixed so that ("ab","c") and ("a","bc") differ.
                hasher.update(&(entry.value().len() as u64).to_le_bytes());
                hasher.update(entry.value().as_bytes());
            }
            if i + 1 == entries.len() {
                let index = node.rule?;
                let rule = &self.rules[index];
                hasher.update(&rule.id.to_le_bytes());
                return Some(Match {
                    rule,
                    index,
                    entity: hasher.digest128(),
                });
            }
            level = &node.children;
        }
        None
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
            let node = level.get(entry.key())?.lookup(entry.value())?;
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
                    if l.limit.algorithm == Algorithm::FixedWindow {
                        out.push_str(" algorithm=fixed_window");
                    }
                }
            }
            let _ = writeln!(
                out,
                ", shadow_mode: {}, quota_mode: {}{}",
                r.shadow_mode,
                r.quota_mode,
                if r.name.is_empty() {
                    String::new()
                } else {
                    format!(", name: {}", r.name)
                }
            );
        }
        out
    }
}

/// Parses and compiles rules sources given as (name, text), reporting every error of every
/// file at once: key, syntax and type problems and semantic ones alike.
///
/// # Errors
/// Every problem found; nothing is compiled when there is one.
pub fn compile_sources(
    sources: &[(String, String)],
    merge_domains: bool,
) -> Result<RuleSet, Vec<ConfigError>> {
    let mut parsed = Vec::new();
    let mut errors = Vec::new();
    for (name, text) in sources {
        let (file, mut errs) = model::parse_lenient(name, text);
        errors.append(&mut errs);
        if let Some(f) = file {
            parsed.push((name.clone(), f));
        }
    }
    with_prior_errors(errors, RuleSet::compile(&parsed, merge_domains))
}

/// `result`, failed when `prior` holds errors found before it (they come first): a file that
/// could not be read or parsed fails the load even when the rest compiles.
///
/// # Errors
/// `prior` followed by `result`'s own errors.
pub fn with_prior_errors(
    mut prior: Vec<ConfigError>,
    result: Result<RuleSet, Vec<ConfigError>>,
) -> Result<RuleSet, Vec<ConfigError>> {
    match result {
        Ok(set) if prior.is_empty() => Ok(set),
        Ok(_) => Err(prior),
        Err(mut e) => {
            prior.append(&mut e);
            Err(prior)
        }
    }
}

struct Compiler<'a> {
    file: &'a str,
    domain: &'a str,
    rules: &'a mut Vec<Rule>,
    errors: &'a mut Vec<ConfigError>,
}

impl Compiler<'_> {
    fn error(&mut self, message: impl Into<String>) {
        self.errors.push(ConfigError::new(self.file, message));
    }

    fn load(
        &mut self,
        level: &mut HashMap<String, KeyLevel>,
        parent_key: &str,
        descriptors: &[DescriptorConfig],
        inherited_value_to_metric: bool,
    ) {
        for d in descriptors {
            if d.key.is_empty() {
                self.error("descriptor has empty key");
                continue;
            }
            let final_key = if d.value.is_empty() {
                d.key.clone()
            } else {
                format!("{}_{}", d.key, d.value)
            };
            let composite = format!("{parent_key}{final_key}");
            let kind = if d.value.is_empty() {
                Kind::AnyValue
            } else if d.value.contains('*') {
                Kind::Wildcard
            } else {
                Kind::Exact
            };
            let key_level = level.entry(d.key.clone()).or_default();
            let duplicate = match kind {
                Kind::AnyValue => key_level.any_value.is_some(),
                Kind::Wildcard => key_level.wildcards.iter().any(|(p, _)| *p == d.value),
                Kind::Exact => key_level.exact.contains_key(&d.value),
            };
            if duplicate {
                self.error(format!("duplicate descriptor composite key '{composite}'"));
                continue;
            }
            if d.share_threshold && kind != Kind::Wildcard {
                self.error(format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                ));
            }
            let value_to_metric = inherited_value_to_metric || d.value_to_metric;
            let rule = self.rule(d, &composite, value_to_metric);
            let mut node = Node {
                kind,
                final_key,
                rule,
                share_threshold: d.share_threshold,
                value_to_metric: d.value_to_metric,
                children: HashMap::new(),
            };
            self.load(
                &mut node.children,
                &format!("{composite}."),
                &d.descriptors,
                value_to_metric,
            );
            // Re-borrow: the recursive load may not hold `level`'s entry.
            let key_level = level.entry(d.key.clone()).or_default();
            match kind {
                Kind::AnyValue => key_level.any_value = Some(Box::new(node)),
                Kind::Wildcard => key_level.wildcards.push((d.value.clone(), node)),
                Kind::Exact => {
                    key_level.exact.insert(d.value.clone(), node);
                }
            }
        }
    }

    fn rule(
        &mut self,
        d: &DescriptorConfig,
        composite: &str,
        value_to_metric: bool,
    ) -> Option<usize> {
        let Some(rl) = &d.rate_limit else {
            if !d.additional_limits.is_empty() {
                self.error(format!(
                    "additional_limits needs a rate_limit block: '{composite}'"
                ));
            }
            return None;
        };
        let unit = Unit::parse(&rl.unit);
        let mut limits = Vec::new();
        if rl.unlimited {
            if unit.is_some() {
                self.error("should not specify rate limit unit when unlimited");
            }
            if !d.additional_limits.is_empty() {
                self.error(format!(
                    "additional_limits cannot be used with unlimited: '{composite}'"
                ));
            }
        } else {
            let primary = LimitConfig {
                unit: rl.unit.clone(),
                requests_per_unit: rl.requests_per_unit,
                unit_multiplier: rl.unit_multiplier,
                algorithm: rl.algorithm.clone(),
            };
            for l in std::iter::once(&primary).chain(&d.additional_limits) {
                if let Some(spec) = self.limit(l) {
                    limits.push(spec);
                }
            }
        }
        for r in &rl.replaces {
            if r.name.is_empty() {
                self.error("should not have an empty replaces entry");
            } else if r.name == rl.name {
                self.error("replaces should not contain name of same descriptor");
            }
        }
        let mut id_input = format!("{composite}|{}", rl.unlimited);
        for l in &limits {
            let _ = write!(id_input, "|{:?}", l.limit);
        }
        self.rules.push(Rule {
            id: xxh3_64(id_input.as_bytes()),
            domain: self.domain.to_string(),
            full_key: composite.to_string(),
            name: rl.name.clone(),
            limits,
            unlimited: rl.unlimited,
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            value_to_metric,
            replaces: rl.replaces.iter().map(|r| r.name.clone()).collect(),
        });
        Some(self.rules.len() - 1)
    }

    fn limit(&mut self, l: &LimitConfig) -> Option<LimitSpec> {
        let Some(unit) = Unit::parse(&l.unit) else {
            self.error(format!("invalid rate limit unit '{}'", l.unit));
            return None;
        };
        let multiplier = l.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            self.error("unit_multiplier must be at least 1");
            return None;
        }
        let algorithm = match l.algorithm.as_deref() {
            None | Some("sliding_window") => Algorithm::SlidingWindow,
            Some("fixed_window") => Algorithm::FixedWindow,
            Some(other) => {
                self.error(format!(
                    "invalid algorithm '{other}' (expected sliding_window or fixed_window)"
                ));
                return None;
            }
        };
        Some(LimitSpec {
            limit: Limit {
                requests_per_unit: l.requests_per_unit,
                window_ms: unit.seconds() * 1000 * u64::from(multiplier),
                algorithm,
            },
            unit,
        })
    }
}

/// Whether `value` matches `pattern`, where `*` matches zero or more bytes. Linear in practice:
/// on a mismatch it retries only from the last `*`.
fn wildcard_match(pattern: &[u8], value: &[u8]) -> bool {
    let (mut p, mut v) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while v < value.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, v));
            p += 1;
        } else if p < pattern.len() && pattern[p] == value[v] {
            p += 1;
            v += 1;
        } else if let Some((sp, sv)) = star {
            p = sp + 1;
            v = sv + 1;
            star = Some((sp, sv + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::parse;

    fn set(yaml: &str) -> RuleSet {
        RuleSet::compile(&[("t.yaml".into(), parse("t.yaml", yaml).unwrap())], false).unwrap()
    }

    #[test]
    fn wildcards_match_anywhere() {
        for (p, v, m) in [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("*bar", "foobar", true),
            ("f*b*r", "foobar", true),
            ("f*b*r", "foobaz", false),
            ("*", "", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*ab", "aab", true),
        ] {
            assert_eq!(wildcard_match(p.as_bytes(), v.as_bytes()), m, "{p} ~ {v}");
        }
    }

    #[test]
    fn distinct_values_get_distinct_counters_unless_shared() {
        let s = set("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: path\n    value: /api/*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
        let a = s.find("d", &[("ip", "1.1.1.1")]).unwrap().entity;
        let b = s.find("d", &[("ip", "2.2.2.2")]).unwrap().entity;
        assert_ne!(a, b);
        let x = s.find("d", &[("path", "/api/x")]).unwrap().entity;
        let y = s.find("d", &[("path", "/api/y")]).unwrap().entity;
        assert_eq!(x, y);
    }

    #[test]
    fn rule_ids_survive_recompiling_and_change_with_the_limit() {
        let y = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let a = set(y).rules()[0].id;
        assert_eq!(a, set(y).rules()[0].id);
        assert_ne!(a, set(&y.replace("1}", "2}")).rules()[0].id);
    }

    #[test]
    fn every_error_is_reported() {
        let f = parse("e.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: a\n  - value: x\n  - key: b\n    rate_limit: {unit: second, unlimited: true}\n").unwrap();
        let errs = RuleSet::compile(&[("e.yaml".into(), f)], false).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "e.yaml: invalid rate limit unit 'fortnight'",
                "e.yaml: duplicate descriptor composite key 'd.a'",
                "e.yaml: descriptor has empty key",
                "e.yaml: should not specify rate limit unit when unlimited",
            ]
        );
    }

    #[test]
    fn custom_windows_and_several_limits() {
        let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 30, requests_per_unit: 5, algorithm: fixed_window}\n    additional_limits:\n      - {unit: day, requests_per_unit: 100}\n");
        let r = &s.rules()[0];
        assert_eq!(r.limits.len(), 2);
        assert_eq!(r.limits[0].limit.window_ms, 30 * 60_000);
        assert_eq!(r.limits[0].limit.algorithm, Algorithm::FixedWindow);
        assert_eq!(r.limits[1].limit.window_ms, 86_400_000);
        assert!(s.dump().contains("unit_multiplier=30"));
    }
}
