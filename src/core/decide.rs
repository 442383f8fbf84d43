//! The decision: one descriptor's hits against every limit of its rule, on its entity's
//! states ([`decide`]), and what the sync wants to hear of it ([`Wants`]). The one function
//! the service calls per descriptor (`rls/evaluate.rs`, under the entity's shard lock) and
//! the benches time; pure, like the rest of the core: `now` and the fleet are arguments, and
//! the sync's queues are the caller's to act on.

use super::clock::UnixMillis;
use super::fleet_view::FleetView;
use super::limit::{Limit, Verdict};
use super::state::LimitState;

/// What a request does to the counters it is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Look only.
    No,
    /// Count (a denied request's hits only on `strict` limits); with `hold_within`,
    /// descriptors within their limits are not counted and report their count unchanged.
    Yes {
        /// Whether hits within the limits are held back (not counted).
        hold_within: bool,
    },
    /// Give hits back (`is_negative_hits`), reported on the count they leave.
    Refund,
    /// Count hits admitted elsewhere (an Envoy's quota usage report): on every limit, over
    /// or not, strict or not, since they happened whatever the counters say now.
    Admitted,
}

/// The outcome of one descriptor against all of its rule's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether any limit is over.
    pub over: bool,
    /// The limit reported (its index in the rule): the most restrictive one ([`pick`]).
    pub reported: usize,
    /// The reported limit's verdict.
    pub verdict: Verdict,
}

/// What global mode's sync wants after a decision; all false in local mode. The caller
/// acts on each in this order (`rls/evaluate.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wants {
    /// Queue the entity for a sync: any look at an entity is news worth one (a count to
    /// send, or a first read of the fleet's count). Always, in global mode.
    pub dirty: bool,
    /// A burst read before the next tick: a young entity in a burst, or a settled one
    /// spending its share of the room in a surge (`window/prior.rs`, `bucket/burst.rs`).
    pub burst_read: bool,
    /// An early trip: a young entity denied with hits the store has not seen, or admitted
    /// with unsent hits enough to send before the tick (`window/prior.rs`).
    pub early_trip: bool,
}

/// What [`decide`] returns: the outcome, and what the sync wants of the entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The rule's outcome.
    pub outcome: Outcome,
    /// The sync's wants.
    pub wants: Wants,
}

/// Checks `hits` at `now` against every limit of a rule, given as `(limit, strict)` in the
/// rule's order, on the entity's `states` (one per limit, same order), and counts them as
/// `count` says. `fleet` is what the heartbeats say of the fleet in global mode (the prior
/// of a cold entity, the others' rate after departures); `None` in local mode: alone, and
/// no sync to want anything. `None` when the rule has no limits.
///
/// A `strict` limit (the default) counts a denied request's hits too, as the reference's
/// `INCRBY` does; a lenient one only admitted hits. Nothing here allocates: `limits` is
/// walked a few times, so it is an iterator that clones for free (a slice's, mapped).
///
/// ```
/// use sluice::core::decide::{decide, Count};
/// use sluice::core::{Algorithm, Limit, LimitState, UnixMillis};
///
/// let limit = Limit { requests_per_unit: 2, window_ms: 60_000, algorithm: Algorithm::FixedWindow };
/// let mut states = [LimitState::restored(&limit, None)];
/// let t = UnixMillis::from_secs(600);
/// let hit = |states: &mut [LimitState], t| {
///     let count = Count::Yes { hold_within: false };
///     decide([(&limit, true)], states, t, 1, count, None).unwrap().outcome
/// };
/// assert!(!hit(&mut states, t).over);
/// assert_eq!(hit(&mut states, t).verdict.remaining, 0);
/// assert!(hit(&mut states, t).over);
/// let look = decide([(&limit, true)], &mut states, t, 0, Count::No, None).unwrap();
/// assert_eq!(look.outcome.verdict.count_after, 3, "the denied hit is counted too");
/// assert!(!hit(&mut states, t.plus_millis(60_000)).over);
/// ```
#[inline]
pub fn decide<'a, L>(
    limits: L,
    states: &mut [LimitState],
    now: UnixMillis,
    hits: u64,
    count: Count,
    fleet: Option<&FleetView>,
) -> Option<Decision>
where
    L: IntoIterator<Item = (&'a Limit, bool)> + Clone,
{
    let view = fleet.unwrap_or(&FleetView::ALONE);
    // A refund is reported on the count it leaves: one that takes a key back under its
    // limit says so at once (nothing here remembers the key as over).
    let check_hits = if matches!(count, Count::Refund) {
        for ((limit, _), state) in limits.clone().into_iter().zip(states.iter_mut()) {
            state.refund_with(limit, now, hits, view);
        }
        0
    } else {
        hits
    };
    let mut outcome = most_restrictive(limits.clone(), states, now, check_hits, view)?;
    match count {
        Count::No | Count::Refund => {}
        // Held back: nothing is counted, so the status is the count as it stands (the
        // reference reads the unchanged counter), not as if these hits had been added.
        Count::Yes { hold_within: true } if !outcome.over => {
            outcome = most_restrictive(limits.clone(), states, now, 0, view)?;
        }
        Count::Admitted => {
            for ((limit, _), state) in limits.clone().into_iter().zip(states.iter_mut()) {
                state.record_with(limit, now, hits, view);
            }
        }
        Count::Yes { .. } => {
            for ((limit, strict), state) in limits.clone().into_iter().zip(states.iter_mut()) {
                // A `strict` limit (the default) counts a denied request's hits too.
                if !outcome.over || strict {
                    state.record_with(limit, now, hits, view);
                }
            }
        }
    }
    let wants = match fleet {
        Some(fleet) => wants(limits, states, now, outcome.over, fleet),
        None => Wants::default(),
    };
    Some(Decision { outcome, wants })
}

/// Global mode: what the sync wants of the entity after a decision that was `over` or not.
#[inline]
fn wants<'a, L>(
    limits: L,
    states: &[LimitState],
    now: UnixMillis,
    over: bool,
    fleet: &FleetView,
) -> Wants
where
    L: IntoIterator<Item = (&'a Limit, bool)> + Clone,
{
    let burst_read = limits
        .clone()
        .into_iter()
        .zip(states.iter())
        .any(|((limit, _), w)| w.wants_burst_read(limit, now, fleet));
    // A young entity denied here: what its replica admitted while young goes to the store
    // now, before the other replicas settle on a read without it (`window/prior.rs`).
    // Admitted requests skip the check.
    let early_trip = if over {
        states.iter().any(|w| w.wants_sync_when_denied(fleet))
    } else {
        limits
            .into_iter()
            .zip(states.iter())
            .any(|((limit, _), w)| w.wants_early_send(limit, fleet))
    };
    Wants {
        dirty: true,
        burst_read,
        early_trip,
    }
}

/// Checks `hits` against every limit and reports the most restrictive (see [`pick`]).
#[inline]
fn most_restrictive<'a>(
    limits: impl IntoIterator<Item = (&'a Limit, bool)>,
    states: &mut [LimitState],
    now: UnixMillis,
    hits: u64,
    fleet: &FleetView,
) -> Option<Outcome> {
    pick(
        states
            .iter_mut()
            .zip(limits)
            .map(|(w, (limit, _))| w.check_with(limit, now, hits, fleet)),
    )
}

/// The most restrictive of a rule's verdicts, in limit order: over beats within, then fewer
/// hits left, then the later reset. Over if any limit is over. Exact rules pick among the
/// store's verdicts with it too (`rls/exact.rs`).
pub fn pick(verdicts: impl Iterator<Item = Verdict>) -> Option<Outcome> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::*;
    use crate::core::limit::Algorithm;

    const COUNT: Count = Count::Yes { hold_within: false };

    fn states(limits: &[(Limit, bool)]) -> Vec<LimitState> {
        limits
            .iter()
            .map(|(l, _)| LimitState::restored(l, None))
            .collect()
    }

    fn run(
        limits: &[(Limit, bool)],
        states: &mut [LimitState],
        hits: u64,
        count: Count,
        fleet: Option<&FleetView>,
    ) -> Decision {
        let specs = limits.iter().map(|(l, strict)| (l, *strict));
        decide(specs, states, T0, hits, count, fleet).expect("a rule with limits")
    }

    #[test]
    fn the_most_restrictive_limit_is_reported_and_any_over_is_over() {
        let limits = [(fixed(10), true), (fixed(3), true), (sliding(100), true)];
        let mut s = states(&limits);
        let d = run(&limits, &mut s, 2, COUNT, None);
        assert_eq!((d.outcome.over, d.outcome.reported), (false, 1));
        assert_eq!(d.outcome.verdict.remaining, 1);
        let d = run(&limits, &mut s, 2, COUNT, None);
        assert_eq!((d.outcome.over, d.outcome.reported), (true, 1));
        assert_eq!(d.wants, Wants::default(), "local mode wants nothing");
        let none: [(&Limit, bool); 0] = [];
        assert!(decide(none, &mut [], T0, 1, COUNT, None).is_none());
    }

    #[test]
    fn admitted_hits_count_on_every_limit_over_or_not() {
        let limits = [(fixed(2), true), (fixed(5), false)];
        let mut s = states(&limits);
        let d = run(&limits, &mut s, 3, Count::Admitted, None);
        assert!(
            d.outcome.over,
            "3 admitted elsewhere put the first limit over"
        );
        let look = |s: &mut [LimitState], i: usize| {
            s[i].check_with(&limits[i].0, T0, 0, &FleetView::ALONE)
        };
        assert_eq!(
            (look(&mut s, 0).count_after, look(&mut s, 1).count_after),
            (3, 3),
            "counted on the lenient limit too, though over"
        );
    }

    #[test]
    fn a_denied_request_is_counted_only_on_strict_limits() {
        let limits = [(fixed(1), true), (fixed(5), false)];
        let mut s = states(&limits);
        assert!(!run(&limits, &mut s, 1, COUNT, None).outcome.over);
        assert!(run(&limits, &mut s, 1, COUNT, None).outcome.over);
        let look = |s: &mut [LimitState], i: usize| {
            s[i].check_with(&limits[i].0, T0, 0, &FleetView::ALONE)
        };
        assert_eq!(
            (look(&mut s, 0).count_after, look(&mut s, 1).count_after),
            (2, 1)
        );
    }

    #[test]
    fn looking_holding_and_refunding_count_nothing_or_give_back() {
        let limits = [(fixed(10), true)];
        let mut s = states(&limits);
        run(&limits, &mut s, 4, COUNT, None);
        let d = run(&limits, &mut s, 3, Count::No, None);
        assert_eq!(
            d.outcome.verdict.count_after, 7,
            "a look reports the hits as if added"
        );
        // Held back within the limit: the count as it stands.
        let held = run(&limits, &mut s, 3, Count::Yes { hold_within: true }, None);
        assert_eq!(held.outcome.verdict.count_after, 4);
        // Over, a held request is counted as any other.
        let over = run(&limits, &mut s, 7, Count::Yes { hold_within: true }, None);
        assert_eq!(
            (over.outcome.over, over.outcome.verdict.count_after),
            (true, 11)
        );
        // 11 of 10, then 5 given back: reported on the 6 left, within the limit.
        let refund = run(&limits, &mut s, 5, Count::Refund, None);
        assert_eq!(
            (refund.outcome.over, refund.outcome.verdict.count_after),
            (false, 6),
            "reported on what the refund leaves"
        );
        assert_eq!(
            run(&limits, &mut s, 0, Count::No, None)
                .outcome
                .verdict
                .count_after,
            6
        );
    }

    #[test]
    fn global_mode_always_wants_a_sync_and_a_young_entity_denied_an_early_trip() {
        let limits = [(sliding(100), true)];
        let mut s = states(&limits);
        let two = FleetView {
            live: 2,
            ..FleetView::ALONE
        };
        let d = run(&limits, &mut s, 1, COUNT, Some(&two));
        assert_eq!(
            d.wants,
            Wants {
                dirty: true,
                burst_read: false,
                early_trip: false
            }
        );
        // Its prior (52 of 100 on two replicas) spent: denied, with hits unsent.
        let d = run(&limits, &mut s, 60, COUNT, Some(&two));
        assert!(d.outcome.over && d.wants.dirty && d.wants.early_trip);
        let bucket = Limit {
            requests_per_unit: 10,
            window_ms: 1000,
            algorithm: Algorithm::TokenBucket { burst: 10 },
        };
        let mut b = states(&[(bucket, true)]);
        let d = run(&[(bucket, true)], &mut b, 1, COUNT, Some(&FleetView::ALONE));
        assert_eq!(
            d.wants,
            Wants {
                dirty: true,
                burst_read: false,
                early_trip: false
            }
        );
    }
}
