//! Which entities a shard's round trip carries and what its reply does to them: planning
//! takes the due entities from the queue up to the call's size (`batch.rs`) and begins
//! their syncs; settling counts the replies in and requeues or releases each entity.
//! `shard.rs` runs the trips.

use std::sync::atomic::Ordering;

use super::in_flight::Planned;
use super::shard::{ShardSync, Trip};
use super::store::{ShardStore, SyncItem};
use crate::core::clock::UnixMillis;
use crate::core::table::EntityState;
use crate::core::tier::Tier;
use crate::core::{Limit, Plan};

impl<S: ShardStore> ShardSync<S> {
    /// Takes the shard's queue and begins a sync of every due entity, oldest first, up to
    /// the call's size; requeues the others (or releases them when they have nothing left to
    /// send), and the part of the queue the call had no room for first, in its place. A burst
    /// read also reads again the entities of `also` that one sync in flight holds (the burst
    /// read before it), when due: the queue does not hold them meanwhile. The flag says
    /// whether the call had no room for part of the queue.
    pub(super) fn plan(
        &self,
        trip: Trip,
        now: UnixMillis,
        also: &[u128],
    ) -> (Vec<Planned>, Vec<SyncItem>, bool) {
        let table = &self.table;
        let flush = trip == Trip::Flush;
        let policy = &self.settings.policy;
        let size = self.health.batch.get();
        let mut keep = Vec::new();
        let mut planned: Vec<Planned> = Vec::new();
        let mut items = Vec::new();
        let due = |limits: &[Limit], st: &EntityState, items: &Vec<SyncItem>| {
            items.len() < size
                && limits
                    .iter()
                    .zip(st.states.iter())
                    .any(|(l, w)| policy.due(w, l, now, st.last_sync_ms))
        };
        let mut queue = self.queues.take(self.index);
        while let Some(key) = queue.pop_front() {
            if items.len() >= size {
                queue.push_front(key);
                break;
            }
            let step = table.get(key, |e| {
                let st = e.state;
                let limits = table.limits(e.set);
                let pending: i64 = st.states.iter().map(|w| w.pending()).sum();
                let due = if flush {
                    pending != 0
                } else {
                    st.in_flight == 0 && due(&limits, st, &items)
                };
                if due {
                    let plans = self.begin(key, &limits, st, trip, now, &mut items);
                    Step::Planned(Planned { key, limits, plans })
                } else if pending == 0
                    && st.in_flight == 0
                    && st.states.iter().all(|w| w.ever_synced())
                {
                    // Nothing to send: the next hit queues it again.
                    self.queues.release(st);
                    Step::Released
                } else {
                    Step::Kept
                }
            });
            match step {
                Some(Step::Planned(p)) => planned.push(p),
                Some(Step::Kept) => keep.push(key),
                Some(Step::Released) => {}
                // Never while queued (the table keeps what a sync holds); counted out all
                // the same, so the queue's bound stays true.
                None => self.queues.forget_one(),
            }
        }
        let more = !queue.is_empty();
        self.queues.requeue_first(self.index, queue);
        self.queues.requeue(self.index, keep);
        for &key in also.iter().filter(|_| trip == Trip::Burst) {
            let p = table.get(key, |e| {
                let limits = table.limits(e.set);
                (e.state.in_flight == 1 && due(&limits, e.state, &items)).then(|| {
                    let plans = self.begin(key, &limits, e.state, trip, now, &mut items);
                    Planned { key, limits, plans }
                })
            });
            planned.extend(p.flatten());
        }
        (planned, items, more)
    }

    /// Begins a sync of the entity `key` (whose shard's lock the caller holds, `st` its
    /// state): its items go to `items`, and one more sync of it is in flight.
    fn begin(
        &self,
        key: u128,
        limits: &[Limit],
        st: &mut EntityState,
        trip: Trip,
        now: UnixMillis,
        items: &mut Vec<SyncItem>,
    ) -> Vec<Plan> {
        let stats = &self.queues.stats;
        let mut plans = Vec::with_capacity(limits.len());
        for (i, limit) in limits.iter().enumerate() {
            let w = &mut st.states[i];
            let tier = Tier::of(w.pressure(limit, now)) as usize;
            stats.synced_by_tier[tier].fetch_add(1, Ordering::Relaxed);
            let mut plan = w.begin_sync(limit, now);
            plan.set_burst(trip == Trip::Burst);
            items.push(SyncItem::of(key, i as u8, limit, &plan, now));
            plans.push(plan);
        }
        st.in_flight += 1;
        st.last_sync_ms = now.0;
        plans
    }

    /// Settles a successful reply: each entity's deltas are counted and the fleet's totals
    /// taken in; entities with hits since (or, in a fleet, not settled yet) are requeued, the
    /// others released.
    pub(super) fn settle(&self, planned: Vec<Planned>, totals: Vec<[u64; 2]>, done: UnixMillis) {
        let table = &self.table;
        let stats = &self.queues.stats;
        let tick_ms = self.settings.policy.tick_ms;
        let mut totals = totals.into_iter();
        let mut requeue = Vec::new();
        for p in planned {
            let replies: Vec<[u64; 2]> = p
                .plans
                .iter()
                .map(|_| totals.next().unwrap_or([0, 0]))
                .collect();
            let again = table.get(p.key, |e| {
                let st = e.state;
                for (i, (plan, total)) in p.plans.iter().zip(replies).enumerate() {
                    let limit = &p.limits[i];
                    let w = &mut st.states[i];
                    let before = w.pressure(limit, done);
                    let tier_before = Tier::of(before);
                    w.complete_sync(limit, plan, total, done);
                    let after = w.pressure(limit, done);
                    let drift =
                        ((after - before).abs() * f64::from(limit.requests_per_unit)) as u64;
                    stats.drift_hits.fetch_add(drift, Ordering::Relaxed);
                    if Tier::of(after) != tier_before {
                        stats.tier_transitions.fetch_add(1, Ordering::Relaxed);
                    }
                }
                st.in_flight -= 1;
                if st.in_flight > 0 {
                    // A burst read started since holds it: settling that one requeues it or
                    // releases it.
                    return false;
                }
                // In a fleet, an entity stays queued until its first reply is a tick old:
                // until then its node keeps to the prior (`core/window/prior.rs`), so a quiet
                // entity read once must not stay there until its next hit.
                let settling =
                    self.fleet.live_replicas() > 1 && st.states.iter().any(|w| !w.settled(tick_ms));
                if settling || st.states.iter().any(|w| w.pending() != 0) {
                    true
                } else {
                    self.queues.release(st);
                    false
                }
            });
            match again {
                Some(true) => requeue.push(p.key),
                Some(false) => {}
                None => self.queues.forget_one(),
            }
        }
        self.queues.requeue(self.index, requeue);
    }
}

/// What planning does with a queued entity.
enum Step {
    Planned(Planned),
    Kept,
    Released,
}
