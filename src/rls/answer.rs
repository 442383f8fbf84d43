//! Steps 3 and 4 of a request, once resolved: every target evaluated (`evaluate.rs`; exact
//! ones by their answers from the store, `exact.rs`) and the response built (`respond.rs`),
//! with the decision log and the decision counters. A function of what it is handed
//! ([`Answering`]), not a method of the limiter.

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::decision_log::{Decision, DecisionLog};
use super::evaluate::{evaluate, record_stats, Counting};
use super::exact::ExactAnswer;
use super::resolve::Target;
use super::{respond, Options};
use crate::core::clock::UnixMillis;
use crate::core::decide::Count;
use crate::telemetry::RuleStats;

/// What answering a request is handed: what evaluating is ([`Counting`]), the switches and
/// bounds, and the decision log.
pub(super) struct Answering<'a> {
    pub counting: Counting<'a>,
    pub opts: &'a Options,
    pub decisions: &'a DecisionLog,
}

/// Evaluates every target (exact ones by their answers, when given) and builds the
/// response.
pub(super) fn answer(
    a: &Answering<'_>,
    req: &RateLimitRequest,
    targets: &[Target<'_>],
    hits: &[u64],
    now: UnixMillis,
    exact: &[Option<ExactAnswer>],
) -> RateLimitResponse {
    let (counting, opts) = (&a.counting, a.opts);
    let stats = counting.stats;
    // With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, look before counting anything.
    let hold_within =
        opts.stop_increment_when_over_limit && any_over(counting, req, targets, hits, now, exact);
    let mut response = respond::Response::with_capacity(targets.len(), opts);
    let log = a.decisions.wanted();
    let logged =
        |i: usize, rule: Option<&crate::rules::Rule>, outcome: Option<&crate::core::Outcome>| {
            if log {
                let d = Decision {
                    domain: &req.domain,
                    entries: &req.descriptors[i].entries,
                    rule,
                    outcome,
                };
                a.decisions.log(now, &d);
            }
        };
    let entries = |i: usize| req.descriptors[i].entries.as_slice();
    for (i, t) in targets.iter().enumerate() {
        let count = if req.descriptors[i].is_negative_hits {
            Count::Refund
        } else {
            Count::Yes { hold_within }
        };
        let Some(rule) = t.rule() else {
            RuleStats::add(&stats.decisions_no_rule, 1);
            logged(i, None, None);
            response.no_rule();
            continue;
        };
        // Unlimited (and, defensively, a rule without limits): nothing is counted.
        let outcome = match exact.get(i).and_then(Option::as_ref) {
            Some(ExactAnswer::Decided(o)) => Some(*o),
            // The store failed: decided from memory on the cold-entity prior (`core/window/prior.rs`).
            Some(ExactAnswer::Prior) | None => {
                evaluate(counting, t, now, hits[i], count, Some(entries(i)))
            }
        };
        let Some(outcome) = outcome else {
            logged(i, Some(rule), None);
            response.unlimited();
            continue;
        };
        logged(i, Some(rule), Some(&outcome));
        record_stats(opts, t, rule, &outcome, hits[i]);
        let decisions = if outcome.over {
            &stats.decisions_over
        } else {
            &stats.decisions_ok
        };
        RuleStats::add(decisions, 1);
        response.limited(rule, &outcome, opts, || t.policy_id());
    }
    response.finish(req, targets, opts)
}

/// Whether a descriptor would go over (nothing is counted). A refund never does: it
/// takes a count down, so it holds nothing back, whatever the count before it.
pub(super) fn any_over(
    counting: &Counting<'_>,
    req: &RateLimitRequest,
    targets: &[Target<'_>],
    hits: &[u64],
    now: UnixMillis,
    exact: &[Option<ExactAnswer>],
) -> bool {
    targets.iter().zip(hits).enumerate().any(|(i, (t, &h))| {
        if req.descriptors[i].is_negative_hits {
            return false;
        }
        match exact.get(i).and_then(Option::as_ref) {
            Some(ExactAnswer::Decided(o)) => o.over,
            Some(ExactAnswer::Prior) | None => {
                evaluate(counting, t, now, h, Count::No, None).is_some_and(|o| o.over)
            }
        }
    })
}
