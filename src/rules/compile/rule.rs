//! One descriptor's `rate_limit` (and `additional_limits`) compiled into a [`Rule`], with
//! the checks that apply to the rule as a whole.

use super::Compiler;
use crate::core::Limit;
use crate::rules::identity::rule_id;
use crate::rules::locate::Step;
use crate::rules::model::{DescriptorConfig, LimitConfig};
use crate::rules::{Rule, Unit};

impl Compiler<'_> {
    pub(super) fn rule(
        &mut self,
        d: &DescriptorConfig,
        composite: &str,
        value_to_metric: bool,
    ) -> Option<usize> {
        let Some(rl) = &d.rate_limit else {
            if !d.additional_limits.is_empty() {
                self.error_key(
                    "additional_limits",
                    format!("additional_limits needs a rate_limit block: '{composite}'"),
                );
            }
            return None;
        };
        let in_rate_limit = |key: &str| [Step::Key("rate_limit"), Step::KeyItself(key.to_string())];
        let unit = Unit::parse(&rl.unit);
        let mut limits = Vec::new();
        if rl.unlimited {
            if unit.is_some() {
                self.error_at(
                    &in_rate_limit("unit"),
                    "should not specify rate limit unit when unlimited",
                );
            }
            if !d.additional_limits.is_empty() {
                self.error_key(
                    "additional_limits",
                    format!("additional_limits cannot be used with unlimited: '{composite}'"),
                );
            }
            if rl.strict.is_some() {
                self.error_at(
                    &in_rate_limit("strict"),
                    "should not specify strict when unlimited",
                );
            }
            if rl.exact {
                self.error_at(
                    &in_rate_limit("exact"),
                    format!("exact cannot be used with unlimited: '{composite}'"),
                );
            }
        } else {
            let primary = LimitConfig {
                unit: rl.unit.clone(),
                requests_per_unit: rl.requests_per_unit,
                unit_multiplier: rl.unit_multiplier,
                algorithm: rl.algorithm.clone(),
                burst: rl.burst,
                strict: rl.strict,
            };
            let at_primary = [Step::Key("rate_limit")];
            if let Some(spec) = self.limit(&primary, composite, &at_primary) {
                limits.push(spec);
            }
            for (j, l) in d.additional_limits.iter().enumerate() {
                let at = [Step::Key("additional_limits"), Step::Index(j)];
                if let Some(spec) = self.limit(l, composite, &at) {
                    limits.push(spec);
                }
            }
        }
        // Exact rules count a request all or nothing, admitted hits only (docs/global.md, "Exact
        // rules"); a `strict: true` there would promise what they do not do.
        let strict_said = std::iter::once(rl.strict)
            .chain(d.additional_limits.iter().map(|l| l.strict))
            .any(|s| s == Some(true));
        if rl.exact && strict_said {
            self.error_at(
                &in_rate_limit("exact"),
                format!(
                    "strict cannot be used with exact (exact rules count admitted hits only): '{composite}'"
                ),
            );
        }
        for (k, r) in rl.replaces.iter().enumerate() {
            let at = [
                Step::Key("rate_limit"),
                Step::Key("replaces"),
                Step::Index(k),
            ];
            if r.name.is_empty() {
                self.error_at(&at, "should not have an empty replaces entry");
            } else if r.name == rl.name {
                self.error_at(&at, "replaces should not contain name of same descriptor");
            }
        }
        let plain: Vec<Limit> = limits.iter().map(|l| l.limit).collect();
        self.rules.push(Rule {
            id: rule_id(composite, rl.unlimited, &plain),
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
            exact: rl.exact,
            metadata: d.metadata.clone().map(std::sync::Arc::new),
        });
        Some(self.rules.len() - 1)
    }
}
