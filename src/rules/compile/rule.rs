//! One descriptor's `rate_limit` (and `additional_limits`) compiled into a [`Rule`], with
//! the checks that apply to the rule as a whole.

use super::Compiler;
use crate::core::{Algorithm, Limit};
use crate::rules::identity::rule_id;
use crate::rules::locate::Step;
use crate::rules::model::{DescriptorConfig, RateLimitConfig};
use crate::rules::{LimitSpec, Rule, Unit};

impl Compiler<'_> {
    /// The rule of descriptor `d` (at `composite`), pushed to the rule list: its position
    /// there, or `None` when `d` has no `rate_limit`. Errors are reported in the order the
    /// checks run: the unlimited block or each limit, then `exact`, then `replaces`.
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
        let limits = if rl.unlimited {
            self.check_unlimited(d, rl, composite);
            Vec::new()
        } else {
            self.limits(d, rl, composite)
        };
        let additional = [Step::KeyItself("additional_limits".into())];
        let algorithms = limits.iter().map(|l| l.limit.algorithm);
        self.check_concurrency(algorithms, &additional, composite);
        let stricts =
            std::iter::once(rl.strict).chain(d.additional_limits.iter().map(|l| l.strict));
        self.check_exact(rl.exact, stricts, &in_rate_limit("exact"), composite);
        self.check_replaces(rl);
        self.rules.push(Rule {
            id: rule_id(composite, rl.unlimited, &plain(&limits)),
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
            override_of: None,
        });
        self.record_origin(&[]);
        Some(self.rules.len() - 1)
    }

    /// An unlimited rule says nothing that would limit it.
    fn check_unlimited(&mut self, d: &DescriptorConfig, rl: &RateLimitConfig, composite: &str) {
        if Unit::parse(&rl.unit).is_some() {
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
    }

    /// The limits of a rule that is not unlimited: `rate_limit`'s own, then each of
    /// `additional_limits`, those with errors left out.
    fn limits(
        &mut self,
        d: &DescriptorConfig,
        rl: &RateLimitConfig,
        composite: &str,
    ) -> Vec<LimitSpec> {
        let mut limits = Vec::new();
        let at_primary = [Step::Key("rate_limit")];
        if let Some(spec) = self.limit(&rl.limit(), composite, &at_primary) {
            limits.push(spec);
        }
        for (j, l) in d.additional_limits.iter().enumerate() {
            let at = [Step::Key("additional_limits"), Step::Index(j)];
            if let Some(spec) = self.limit(l, composite, &at) {
                limits.push(spec);
            }
        }
        limits
    }

    /// Exact rules count a request all or nothing, admitted hits only (docs/global.md, "Exact
    /// rules"); a `strict: true` among `stricts` (what its limits say) would promise what they
    /// do not do. The error is about the node at `at`.
    pub(super) fn check_exact(
        &mut self,
        exact: bool,
        stricts: impl IntoIterator<Item = Option<bool>>,
        at: &[Step],
        composite: &str,
    ) {
        if exact && stricts.into_iter().any(|s| s == Some(true)) {
            self.error_at(
                at,
                format!(
                    "strict cannot be used with exact (exact rules count admitted hits only): '{composite}'"
                ),
            );
        }
    }

    /// A release (`is_negative_hits`) gives back to every limit of its rule, so a concurrency
    /// limit stands alone: beside a window or a bucket, each release would refund that rate
    /// too. `algorithms` are the rule's limits'; the error goes `at`. Whether they pass.
    pub(super) fn check_concurrency(
        &mut self,
        mut algorithms: impl ExactSizeIterator<Item = Algorithm>,
        at: &[Step],
        composite: &str,
    ) -> bool {
        let alone = algorithms.len() == 1 || !algorithms.any(|a| a == Algorithm::Concurrency);
        if !alone {
            self.error_at(
                at,
                format!("algorithm: concurrency cannot be combined with other limits in one rule (a release gives back to every limit of it): '{composite}'"),
            );
        }
        alone
    }

    /// Each `replaces` entry names another rule.
    fn check_replaces(&mut self, rl: &RateLimitConfig) {
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
    }
}

/// The limits the rule id hashes.
pub(super) fn plain(limits: &[LimitSpec]) -> Vec<Limit> {
    limits.iter().map(|l| l.limit).collect()
}

/// The steps from a descriptor to the key `key` of its `rate_limit`.
fn in_rate_limit(key: &str) -> [Step; 2] {
    [Step::Key("rate_limit"), Step::KeyItself(key.to_string())]
}
