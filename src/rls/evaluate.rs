//! Step 3 of a request: a target's limits checked (and counted, refunded, or only looked
//! at) on its entity by `core::decide`, under its shard's lock; the queue calls the
//! decision wants of global mode's sync; the per-rule metrics.

use super::resolve::Target;
use super::RateLimiter;
use crate::core::clock::UnixMillis;
use crate::core::decide::{decide, Count, Decision, Outcome};
use crate::core::table::{EntityMut, Lookup};
use crate::rules::Rule;
use crate::telemetry::RuleStats;

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

    /// [`RateLimiter::evaluate`] on the entity, under its shard's lock: the decision
    /// (`core::decide`), then the sync's queue calls it wants.
    fn count_on(
        &self,
        rule: &Rule,
        entity: EntityMut<'_>,
        now: UnixMillis,
        hits: u64,
        count: Count,
    ) -> Option<Outcome> {
        let EntityMut { key, state, .. } = entity;
        // Global mode: what the heartbeats say of the fleet, for a cold entity's prior.
        let fleet = self.sync.as_ref().map(|q| q.fleet());
        let limits = rule.limits.iter().map(|spec| (&spec.limit, spec.strict));
        let Decision { outcome, wants } =
            decide(limits, &mut state.states, now, hits, count, fleet.as_ref())?;
        if let Some(q) = &self.sync {
            // A queued entity costs nothing more here.
            if wants.dirty {
                q.mark_dirty(key, state, rule.per_second());
            }
            if wants.burst_read {
                q.want_burst_read(key, rule.per_second());
            }
            if wants.early_trip {
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
