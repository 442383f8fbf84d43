//! A rule's `overrides` compiled: each value's limit into a rule of its own, the very rule a
//! descriptor for that value alone (`key: tenant, value: acme`) with that limit would compile
//! to, and the checks on them: where overrides may be, their values, duplicates, their bounds.

use std::collections::HashSet;

use super::rule::plain;
use super::Compiler;
use crate::rules::identity::rule_id;
use crate::rules::locate::Step;
use crate::rules::model::{self, DescriptorConfig, LimitConfig, OverrideLimit, RateLimitConfig};
use crate::rules::tree::{wildcard_matches, KeyLevel, Kind};
use crate::rules::Rule;

/// The most overrides one rule may have. Each costs a rule, its metric series and its entry
/// in the level's map (about 650 bytes, measured); a constant, not a setting, so that
/// `sluice check` agrees with every server on whether a file loads.
pub const MAX_OVERRIDES_PER_RULE: usize = 100_000;

/// The most overrides all the rules files loaded together may have, so that what they take
/// stays bounded however many files a directory holds: about 130 MB at the bound.
pub const MAX_OVERRIDES: usize = 200_000;

impl Compiler<'_> {
    /// The overrides of descriptor `d` (the current one, a `kind` node on `level` below
    /// `parent_key`, whose rule is at `rule` in the rule list): each value with the position
    /// of its own rule, pushed to the rule list. That rule is `d`'s with the override's
    /// limit in place of `rate_limit`'s and the value's composite key, so its id, its
    /// counters, its metrics and `/rlconfig` are those of a descriptor for the value alone.
    pub(super) fn overrides(
        &mut self,
        d: &DescriptorConfig,
        kind: Kind,
        rule: Option<usize>,
        parent_key: &str,
        level: &KeyLevel,
    ) -> Vec<(String, usize)> {
        if d.overrides.is_empty() {
            return Vec::new();
        }
        let composite = format!("{parent_key}{}", model::final_key(&d.key, &d.value));
        let Some(index) = self.overridable(d, kind, rule, &composite) else {
            return Vec::new();
        };
        // The rule's limits are all there, or its errors are reported and nothing compiles:
        // its values are still checked.
        let complete = self.rules[index].limits.len() == 1 + d.additional_limits.len();
        // A rule comes from a `rate_limit`, so this is its limit.
        let primary = d
            .rate_limit
            .as_ref()
            .map(RateLimitConfig::limit)
            .unwrap_or_default();
        let exact = self.rules[index].exact;
        let mut seen = HashSet::new();
        let mut compiled = Vec::with_capacity(d.overrides.len());
        for (i, o) in d.overrides.iter().enumerate() {
            let at_key = [Step::Key("overrides"), Step::EntryKey(i)];
            let value_composite = format!("{parent_key}{}", model::final_key(&d.key, &o.value));
            let problem = if o.value.is_empty() {
                Some(format!(
                    "an override needs a value, not an empty one: '{composite}'"
                ))
            } else if o.value.contains('*') {
                Some(format!(
                    "override value '{}' contains '*': an override is for one value, not a pattern: '{composite}'",
                    o.value
                ))
            } else if kind == Kind::Wildcard && !wildcard_matches(&d.value, &o.value) {
                Some(format!(
                    "override value '{}' does not match '{}', so it would never apply: '{composite}'",
                    o.value, d.value
                ))
            } else if !seen.insert(o.value.as_str()) {
                Some(format!(
                    "duplicate override value '{}' in '{composite}'",
                    o.value
                ))
            } else if level.exact.contains_key(&o.value) || level.overrides.contains_key(&o.value) {
                Some(format!(
                    "duplicate descriptor composite key '{value_composite}' (another descriptor of key '{}' names the value too)",
                    d.key
                ))
            } else {
                None
            };
            if let Some(message) = problem {
                self.error_at(&at_key, message);
                continue;
            }
            if !complete {
                continue;
            }
            let at = [Step::Key("overrides"), Step::Entry(i)];
            let limit = match &o.limit {
                OverrideLimit::Count(n) => LimitConfig {
                    requests_per_unit: Some(*n),
                    ..primary.clone()
                },
                OverrideLimit::Limit(l) => {
                    let at_strict = [
                        Step::Key("overrides"),
                        Step::Entry(i),
                        Step::KeyItself("strict".into()),
                    ];
                    self.check_exact(exact, [l.strict], &at_strict, &value_composite);
                    l.clone()
                }
            };
            let Some(spec) = self.limit(&limit, &value_composite, &at) else {
                continue;
            };
            let limits: Vec<_> = std::iter::once(spec)
                .chain(self.rules[index].limits[1..].iter().copied())
                .collect();
            let algorithms = limits.iter().map(|l| l.limit.algorithm);
            if !self.check_concurrency(algorithms, &at, &value_composite) {
                continue;
            }
            let parent = &self.rules[index];
            let rule = Rule {
                id: rule_id(&value_composite, false, &plain(&limits)),
                full_key: value_composite,
                limits,
                override_of: Some(parent.full_key.clone()),
                ..parent.clone()
            };
            self.rules.push(rule);
            self.record_origin(&[Step::Key("overrides"), Step::EntryKey(i)]);
            compiled.push((o.value.clone(), self.rules.len() - 1));
        }
        compiled
    }

    /// The position of `d`'s rule, when `d` may have overrides: a key-only or wildcard
    /// descriptor with a limited rule, within the bounds. Else the error, and `None`.
    fn overridable(
        &mut self,
        d: &DescriptorConfig,
        kind: Kind,
        rule: Option<usize>,
        composite: &str,
    ) -> Option<usize> {
        let count = d.overrides.len();
        let before = *self.override_count;
        *self.override_count += count;
        let problem = if kind == Kind::Exact {
            format!(
                "overrides need a key-only or wildcard descriptor, but '{composite}' is for the value '{}' alone (drop 'value', or make it a pattern with '*')",
                d.value
            )
        } else if rule.is_none() {
            format!("overrides needs a rate_limit block: '{composite}'")
        } else if rule.is_some_and(|r| self.rules[r].unlimited) {
            format!("overrides cannot be used with unlimited: '{composite}'")
        } else if count > MAX_OVERRIDES_PER_RULE {
            format!(
                "'{composite}' has {count} overrides, at most {MAX_OVERRIDES_PER_RULE} are allowed per rule"
            )
        } else if before + count > MAX_OVERRIDES {
            // Said once, at the rule that crosses the bound; the rules after it are not
            // compiled.
            if before > MAX_OVERRIDES {
                return None;
            }
            format!(
                "the rules have more than {MAX_OVERRIDES} overrides in all ('{composite}' brings them to {})",
                before + count
            )
        } else {
            return rule;
        };
        self.error_key("overrides", problem);
        None
    }
}

#[cfg(test)]
#[path = "overrides_tests.rs"]
mod tests;
