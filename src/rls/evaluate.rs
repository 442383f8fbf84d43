//! Step 3 of a request: a target's limits checked (and counted, refunded, or only looked
//! at) on its entity, under its shard's lock, and the per-rule metrics.

use super::resolve::Target;
use super::RateLimiter;
use crate::core::clock::UnixMillis;
use crate::core::table::{EntityMut, Lookup};
use crate::core::{FleetView, LimitState, Verdict};
use crate::rules::Rule;
use crate::telemetry::RuleStats;

/// The outcome of one descriptor against all of its rule's limits.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub(super) over: bool,
    /// The limit reported: the most restrictive one.
    pub(super) reported: usize,
    pub(super) verdict: Verdict,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Count {
    /// Look only.
    No,
    /// Count (a denied request's hits only on `strict` limits); with `hold_within`,
    /// descriptors within their limits are not counted and report their count unchanged.
    Yes { hold_within: bool },
    /// Give hits back (`is_negative_hits`).
    Refund,
}

// === impl RateLimiter ===

impl RateLimiter {
    /// Checks (and, per `count`, counts) `hits` against every limit of the target's rule.
    /// `None` for targets that are not counted (no rule, unlimited).
    pub(super) fn evaluate(
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
        let count_hits = |e: EntityMut<'_>| self.count_on(rule, e, now, hits, count);
        let (outcome, lookup) = self.entities.with(
            entity,
            now,
            || rule.limits.iter().map(|l| l.limit).collect(),
            count_hits,
        );
        let stats = &self.telemetry.service;
        RuleStats::add(
            match lookup {
                Lookup::Hit => &stats.cache_hits,
                Lookup::Miss => &stats.cache_misses,
            },
            1,
        );
        outcome
    }

    /// [`RateLimiter::evaluate`] on the entity, under its shard's lock.
    fn count_on(
        &self,
        rule: &Rule,
        entity: EntityMut<'_>,
        now: UnixMillis,
        hits: u64,
        count: Count,
    ) -> Option<Outcome> {
        let EntityMut { key, state, .. } = entity;
        let states = &mut state.states;
        let check_hits = if matches!(count, Count::Refund) {
            0
        } else {
            hits
        };
        // Global mode: what the heartbeats say of the fleet, for a cold entity's prior.
        let fleet = self.sync.as_ref().map_or(FleetView::ALONE, |q| q.fleet());
        let mut outcome = most_restrictive(rule, states, now, check_hits, &fleet)?;
        match count {
            Count::No => {}
            Count::Refund => {
                for (i, spec) in rule.limits.iter().enumerate() {
                    states[i].refund(&spec.limit, now, hits);
                }
            }
            // Held back: nothing is counted, so the status is the count as it stands (the
            // reference reads the unchanged counter), not as if these hits had been added.
            Count::Yes { hold_within: true } if !outcome.over => {
                outcome = most_restrictive(rule, states, now, 0, &fleet)?;
            }
            Count::Yes { .. } => {
                for (i, spec) in rule.limits.iter().enumerate() {
                    // A `strict` limit (the default) counts a denied request's hits too.
                    if !outcome.over || spec.strict {
                        states[i].record_with(&spec.limit, now, hits, &fleet);
                    }
                }
            }
        }
        // Global mode: any look at an entity is news worth a sync (a count to send, or a
        // first read of the fleet's count); a queued entity costs nothing more here.
        if let Some(q) = &self.sync {
            q.mark_dirty(key, state, rule.per_second());
            let young_and_full = rule
                .limits
                .iter()
                .zip(state.states.iter())
                .any(|(spec, w)| w.wants_burst_read(&spec.limit, now, &fleet));
            if young_and_full {
                q.want_burst_read(key, rule.per_second());
            }
            // A young entity denied here: what its replica admitted while young goes to the
            // store now, before the other replicas settle on a read without it
            // (`core/prior.rs`). Admitted requests skip the check.
            let spent = if outcome.over {
                state
                    .states
                    .iter()
                    .any(|w| w.wants_sync_when_denied(&fleet))
            } else {
                rule.limits
                    .iter()
                    .zip(state.states.iter())
                    .any(|(spec, w)| w.wants_early_send(&spec.limit, &fleet))
            };
            if spent {
                q.want_early_trip(key, rule.per_second());
            }
        }
        Some(outcome)
    }

    pub(super) fn record_stats(&self, t: &Target<'_>, rule: &Rule, o: &Outcome, hits: u64) {
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
            let limit = rule.limits[o.reported].limit.capacity();
            let near = (f64::from(limit) * self.opts.near_limit_ratio).floor() as u64;
            if o.verdict.count_after > near {
                RuleStats::add(&s.near_limit, hits);
            }
        }
    }
}

/// Checks `hits` against every limit of `rule` and reports the most restrictive (see
/// [`pick`]).
fn most_restrictive(
    rule: &Rule,
    states: &mut [LimitState],
    now: UnixMillis,
    hits: u64,
    fleet: &FleetView,
) -> Option<Outcome> {
    pick(
        states
            .iter_mut()
            .zip(&rule.limits)
            .map(|(w, spec)| w.check_with(&spec.limit, now, hits, fleet)),
    )
}

/// The most restrictive of a rule's verdicts, in limit order: over beats within, then fewer
/// hits left, then the later reset. Over if any limit is over.
pub(super) fn pick(verdicts: impl Iterator<Item = Verdict>) -> Option<Outcome> {
    let mut outcome: Option<Outcome> = None;
    for (i, v) in verdicts.enumerate() {
        let better = match &outcome {
            None => true,
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
    outcome
}
