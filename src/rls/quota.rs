//! Envoy's quota usage (RLQS) counted in the limiter: a bucket's reported admitted requests
//! recorded in the counter `ShouldRateLimit` uses for the same rule and values, and that
//! counter's state read back, for `rlqs/` to share out. One limit, whichever protocol Envoy
//! speaks: the same table entry, the same sync.

use super::evaluate::Counting;
use super::{Compiled, RateLimiter};
use crate::core::clock::UnixMillis;
use crate::core::decide::Count;
use crate::core::{Limit, Summary, Verdict};
use crate::rules::Rule;
use crate::telemetry::RuleStats;

/// A counter's state after a quota usage was counted (or looked at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaCount {
    /// The limit reported: the rule's most restrictive one.
    pub limit: Limit,
    /// Its verdict after the admitted requests: the fleet's estimated count and the reset.
    pub verdict: Verdict,
    /// The rule never denies: `shadow_mode` (its own, or the service's).
    pub allow_all: bool,
    /// A window limit's count in the epoch before the current one (0 for a bucket): how fast
    /// a sliding window's count drains as that epoch slides out.
    pub prev: u64,
}

// === impl RateLimiter ===

impl RateLimiter {
    /// [`count`] on this limiter's table, fleet view and queues.
    pub fn count_quota(
        &self,
        compiled: &Compiled,
        index: usize,
        entity: u128,
        counts: (u64, u64),
        now: UnixMillis,
    ) -> Option<QuotaCount> {
        let at = Quota {
            counting: self.counting(),
            shadow_mode: self.opts.shadow_mode,
        };
        count(&at, compiled, (index, entity), counts, now)
    }
}

/// What counting a quota usage is handed: the way to count (the table, the fleet view, the
/// queues) and the service's `shadow_mode`.
pub(super) struct Quota<'a> {
    pub counting: Counting<'a>,
    pub shadow_mode: bool,
}

/// Counts `admitted` requests (admitted by an Envoy from its quota assignment) on every
/// limit of the rule at `index` of `compiled`, in the counter `entity`, over or not, and
/// returns the counter's state; 0 only looks. `denied` requests go to the rule's metrics
/// only: Envoy refused them, so they take none of the room.
///
/// `None`: no such rule, or an unlimited one (nothing to count or share).
pub(super) fn count(
    at: &Quota<'_>,
    compiled: &Compiled,
    (index, entity): (usize, u128),
    (admitted, denied): (u64, u64),
    now: UnixMillis,
) -> Option<QuotaCount> {
    let rule: &Rule = compiled.rules.rules().get(index)?;
    if rule.unlimited || rule.limits.is_empty() {
        return None;
    }
    let stats = compiled.stats.get(index)?.clone();
    let counts = compiled.counts.get(index).map(|c| &**c);
    let target = super::resolve::Target::Rule(rule, entity, stats.clone(), counts);
    let outcome =
        super::evaluate::evaluate(&at.counting, &target, now, admitted, Count::Admitted, None)?;
    if admitted > 0 || denied > 0 {
        RuleStats::add(&stats.total_hits, admitted.saturating_add(denied));
        RuleStats::add(&stats.within_limit, admitted);
        RuleStats::add(&stats.over_limit, denied);
    }
    let limit = rule.limits[outcome.reported].limit;
    let summary = at
        .counting
        .table
        .get(entity, |e| {
            e.state.states[outcome.reported].summary(&limit, now)
        })
        .flatten();
    Some(QuotaCount {
        limit,
        verdict: outcome.verdict,
        allow_all: rule.shadow_mode || at.shadow_mode,
        prev: match summary {
            Some(Summary::Window { counts, .. }) => counts[0],
            _ => 0,
        },
    })
}
