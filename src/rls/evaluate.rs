//! Step 3 of a request: a target's limits checked (and counted, refunded, or only looked
//! at) on its entity by `core::decide`, under its shard's lock; the queue calls the
//! decision wants of global mode's sync; the per-rule metrics; the rule's per-period counts
//! and `/top` candidates (`core/table/counts.rs`): a comparison or two per decision, the
//! candidates' atomic and lock only when the entity climbs a step of its limit.
//!
//! A function of what it is handed ([`Counting`]: the table, the fleet view, the queues),
//! not a method of the limiter: it cannot reach the rules in force, the exact client or
//! the response.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use super::resolve::Target;
use super::Options;
use crate::core::clock::UnixMillis;
use crate::core::decide::{decide, Count, Decision, Outcome};
use crate::core::table::{period_of, EntityMut, EntityState, EntityTable, Lookup, RuleCounts};
use crate::core::FleetView;
use crate::global::SyncQueues;
use crate::rules::Rule;
use crate::telemetry::{RuleStats, ServiceStats};

/// What evaluating a request's targets is handed.
#[derive(Clone, Copy)]
pub(super) struct Counting<'a> {
    /// The entity table the counters live in.
    pub table: &'a EntityTable,
    /// Global mode: what the heartbeats say of the fleet, read once for the request (a
    /// cold entity's prior, the others' rate after departures); `None` in local mode.
    pub fleet: Option<FleetView>,
    /// Global mode: where entities with news are queued for the sync.
    pub queues: Option<&'a SyncQueues>,
    /// `NEAR_LIMIT_RATIO`: when a decision counts as near its limit.
    pub near_limit_ratio: f64,
    /// The table's hit and miss counters.
    pub stats: &'a ServiceStats,
}

/// Checks (and, per `count`, counts) `hits` against every limit of the target's rule.
/// `None` for targets that are not counted (no rule, unlimited). A counted decision
/// notes the entity in its rule's counts; `entries`, the descriptor's, are copied only
/// when it gets into the rule's `/top` candidates.
pub(super) fn evaluate(
    at: &Counting<'_>,
    t: &Target<'_>,
    now: UnixMillis,
    hits: u64,
    count: Count,
    entries: Option<&[Entry]>,
) -> Option<Outcome> {
    let (rule, entity, counts) = match t {
        Target::NoRule => return None,
        Target::Rule(r, e, _, c) => (*r, *e, *c),
        Target::Override(r, e, _) => (r, *e, None),
    };
    if rule.unlimited {
        return None;
    }
    let counts = counts.filter(|_| matches!(count, Count::Yes { .. } | Count::Admitted));
    let window = rule.limits.first().map_or(1000, |l| l.limit.window_ms);
    let period = period_of(now.0, window);
    let count_hits = |e: EntityMut<'_>| {
        let outcome = count_on(at, rule, e.key, e.state, now, hits, count)?;
        let offer = counts.and_then(|c| mark(at, rule, &outcome, e.state, c, period));
        Some((outcome, offer))
    };
    let (decided, lookup) = at.table.with_rule(
        entity,
        now,
        || (rule.id, rule.limits.iter().map(|l| l.limit).collect()),
        count_hits,
    );
    let outcome = decided.map(|(outcome, offer)| {
        // Quota reports (RLQS) carry no descriptor: their keys are counted, not listed.
        if let (Some(ratio), Some(c), Some(entries)) = (offer, counts, entries) {
            c.candidates.offer(entity, ratio, period, || {
                (entries.iter())
                    .map(|e| (e.key.as_str().into(), e.value.as_str().into()))
                    .collect()
            });
        }
        outcome
    });
    let stats = at.stats;
    RuleStats::add(
        match lookup {
            Lookup::Hit => &stats.cache_hits,
            Lookup::Miss => &stats.cache_misses,
        },
        1,
    );
    outcome
}

/// [`evaluate`] on the entity, under its shard's lock: the decision (`core::decide`),
/// then the sync's queue calls it wants.
fn count_on(
    at: &Counting<'_>,
    rule: &Rule,
    key: u128,
    state: &mut EntityState,
    now: UnixMillis,
    hits: u64,
    count: Count,
) -> Option<Outcome> {
    let limits = rule.limits.iter().map(|spec| (&spec.limit, spec.strict));
    let Decision { outcome, wants } = decide(
        limits,
        &mut state.states,
        now,
        hits,
        count,
        at.fleet.as_ref(),
    )?;
    if let Some(q) = at.queues {
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

/// Notes a counted decision in the rule's counts: near (at or past `NEAR_LIMIT_RATIO`
/// of the reported limit, over included) and over, once a period each; the ratio to
/// offer the entity to the `/top` candidates at, when it climbed a step and could get in.
fn mark(
    at: &Counting<'_>,
    rule: &Rule,
    o: &Outcome,
    state: &mut EntityState,
    counts: &RuleCounts,
    period: u32,
) -> Option<f64> {
    let capacity = rule.limits[o.reported].limit.capacity().max(1);
    let ratio = o.verdict.count_after as f64 / f64::from(capacity);
    let near = o.over || ratio >= at.near_limit_ratio;
    (state.marks.update(counts, period, ratio, near, o.over))
        .filter(|&r| counts.candidates.could_admit(r, period))
}

/// The rule's series of a decision: hits within, over, near the limit, in shadow mode.
pub(super) fn record_stats(opts: &Options, t: &Target<'_>, rule: &Rule, o: &Outcome, hits: u64) {
    let s = match t {
        Target::Rule(_, _, s, _) | Target::Override(_, _, s) => s,
        Target::NoRule => return,
    };
    RuleStats::add(&s.total_hits, hits);
    if o.over {
        RuleStats::add(&s.over_limit, hits);
        if rule.shadow_mode || opts.shadow_mode {
            RuleStats::add(&s.shadow_mode, hits);
        }
    } else {
        RuleStats::add(&s.within_limit, hits);
        let limit = rule.limits[o.reported].limit.capacity();
        let near = (f64::from(limit) * opts.near_limit_ratio).floor() as u64;
        if o.verdict.count_after > near {
            RuleStats::add(&s.near_limit, hits);
        }
    }
}
