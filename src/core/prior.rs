//! What a replica knows of the fleet ([`FleetView`]: the live replicas its heartbeats count,
//! the sync tick, the last departure) and the two things decided from it: the **prior** a
//! cold entity is decided on, and how much of the others' measured rate still applies after
//! replicas left.
//!
//! # The prior
//! A node that has not read an entity's count knows nothing of the other replicas' hits.
//! Deciding on the whole limit (local mode) lets each of N replicas hit at once admit the
//! whole limit: N× in a burst. Instead, while an entity is *young* — no reply yet (its shard
//! may be unreachable), or its first reply less than a tick old — a node admits its own hits
//! only up to `limit / live replicas` in the window, with [`PRIOR_SLACK`] (at least 1, so a
//! never-seen value is admitted). Why a whole tick after the first reply: an entity's first sync goes out at once
//! (an early round trip), when the others' hits are still mostly pending on their nodes; a
//! read a tick later holds every replica's hits up to at least that first reply, so the share
//! measured from it (own hits over the fleet's count, `fleet.rs`) means something. The
//! measured shares take over then.
//!
//! The price: in a burst that reaches the limit within the young period, a node whose share
//! of the burst is above `1 / N` denies hits while another, below it, still has room. The
//! fleet admits about the limit in all, but the exact limiter would have admitted the first
//! hits at whatever node they arrived: the difference is about `0.4 × sqrt((N − 1) / limit)`
//! of the limit with an even prior (the mean excess of N binomial shares), the false denials
//! the simulator shows for within-a-tick bursts. No scheme that decides without a round trip
//! does better without admitting more; the slack trades a little of one for the other.
//!
//! # Departures
//! The others' rate is measured between replies and extrapolated until the next one; after a
//! replica leaves (its heartbeat removed or expired) the rate measured before includes its
//! traffic. Until the next reply re-measures it, a rate measured before the drop is scaled by
//! `(live − 1) / (before − 1)`: the departed replicas' part of it, taken as even, is no
//! longer projected forward.

use super::clock::UnixMillis;
use super::window::{Limit, WindowState};

/// How far above its even share of the limit a young entity's node may go. A burst lands
/// on the replicas in binomial shares, and a node above `limit / N` denies hits the exact
/// limiter admits while another is below it. 5 % more, at the cost of at most 5 % admitted
/// over the limit while the whole fleet is young, took the simulator's within-a-tick bursts
/// (six seeds) from 0.5–3.7 % false denials to 0–1.2 % at 2 replicas, 1.2–5.3 % to 0–4.1 %
/// at 4, 5.2–7.2 % to 3.5–5.4 % at 20 and 7.4–10.7 % to 5.2–8.5 % at 50.
pub const PRIOR_SLACK: f64 = 1.05;

/// What a node knows of the fleet when it decides: an argument, never read from shared
/// state inside the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetView {
    /// Live replicas (this one included), as the last heartbeat reply counted them; ≥ 1.
    pub live: u32,
    /// The sync tick (ms): how long after an entity's first reply its count is trusted.
    pub tick_ms: u64,
    /// The live count just before the last time it dropped (0: it never dropped).
    pub before: u32,
    /// When the count last dropped (Unix ms of the reply that showed it).
    pub dropped_at: u64,
}

impl FleetView {
    /// A node alone (local mode, or a fleet whose size is not known yet): no prior.
    pub const ALONE: FleetView = FleetView {
        live: 1,
        tick_ms: 1000,
        before: 0,
        dropped_at: 0,
    };

    /// The hits a node may admit in a window before the fleet's count is known: its even
    /// share of the limit with [`PRIOR_SLACK`], at least 1.
    pub fn prior(&self, rpu: u32) -> u64 {
        let even = f64::from(rpu) * PRIOR_SLACK / f64::from(self.live.max(1));
        (even as u64).max(1)
    }

    /// The share of the room a node takes when it has no measured share: `1 / live`.
    pub fn prior_share(&self) -> f64 {
        1.0 / f64::from(self.live.max(1))
    }

    /// How much of the others' rate measured at `measured_at` (Unix ms) still applies: less
    /// than 1 when replicas left since.
    pub fn rate_factor(&self, measured_at: u64) -> f64 {
        if self.before > self.live && self.before >= 2 && measured_at < self.dropped_at {
            f64::from(self.live.max(1) - 1) / f64::from(self.before - 1)
        } else {
            1.0
        }
    }
}

// === impl WindowState ===

impl WindowState {
    /// Whether the first reply is at least `tick_ms` old (capped at 65 s): the count read
    /// shows every replica's hits, and a share measured on it means something.
    pub fn settled(&self, tick_ms: u64) -> bool {
        self.synced_at != 0 && u64::from(self.age_ms) >= tick_ms.min(u64::from(u16::MAX))
    }

    /// Whether decisions on this limit still keep to the prior (see the module docs).
    pub(super) fn young(&self, fleet: &FleetView) -> bool {
        fleet.live > 1 && !self.settled(fleet.tick_ms)
    }

    /// Whether `hits` more would take this node's own hits in the window past its prior,
    /// while the entity is young.
    pub(super) fn over_prior(
        &self,
        limit: &Limit,
        now: UnixMillis,
        epoch: u64,
        hits: u64,
        fleet: &FleetView,
    ) -> bool {
        if !self.young(fleet) {
            return false;
        }
        let (prev, curr) = self.pair(epoch, |i, _| u64::try_from(self.own[i]).unwrap_or(0));
        let own = Self::window(limit, now, epoch, prev, curr);
        own.saturating_add(hits) > fleet.prior(limit.requests_per_unit)
    }

    /// A reply arrived at `now`: the time since the first reply grows by the time since the
    /// last one.
    pub(super) fn grow_older(&mut self, now: UnixMillis) {
        if self.synced_at != 0 {
            let since = now
                .0
                .saturating_sub(self.synced_at)
                .min(u64::from(u16::MAX));
            self.age_ms = self.age_ms.saturating_add(since as u16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::*;

    fn fleet(live: u32) -> FleetView {
        FleetView {
            live,
            ..FleetView::ALONE
        }
    }

    /// Decides single hits at `t` with `f` until one is denied; how many were admitted.
    fn admit(s: &mut WindowState, l: &Limit, t: UnixMillis, f: &FleetView) -> u64 {
        (0..10_000)
            .take_while(|_| {
                let v = s.check_with(l, t, 1, f);
                if !v.over {
                    s.record(l, t, 1);
                }
                !v.over
            })
            .count() as u64
    }

    #[test]
    fn a_cold_entity_gets_its_share_of_the_limit() {
        let l = sliding(100);
        for (live, want) in [(1, 100), (2, 52), (4, 26), (3, 35)] {
            let mut s = WindowState::default();
            assert_eq!(admit(&mut s, &l, T0, &fleet(live)), want, "{live} replicas");
        }
        // A never-seen value is admitted however many replicas share a small limit.
        let mut s = WindowState::default();
        assert_eq!(admit(&mut s, &sliding(10), T0, &fleet(50)), 1);
    }

    #[test]
    fn the_prior_holds_until_the_first_reply_is_a_tick_old() {
        let l = sliding(100);
        let f = fleet(4);
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        // A first reply right away shows only this node's hit: a share of 1 measured on
        // nothing, which must not open the whole room.
        assert_eq!(admit(&mut s, &l, T0, &f), 26);
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        assert!(s.young(&f));
        assert_eq!(admit(&mut s, &l, T0.plus_millis(3), &f), 0);
        // Half a tick later, still young; a tick after the first reply, the count decides.
        sync(&mut s, &l, &mut store, T0.plus_millis(500));
        assert!(s.young(&f));
        sync(&mut s, &l, &mut store, T0.plus_millis(1_002));
        assert!(!s.young(&f));
        assert_eq!(admit(&mut s, &l, T0.plus_millis(1_003), &f), 74);
    }

    #[test]
    fn a_departed_replicas_rate_is_not_projected_forward() {
        let l = fixed(1000);
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        let t = T0.plus_millis(10_000);
        sync(&mut s, &l, &mut store, t);
        // Two others add 20 in a second: 20 a second, extrapolated.
        *store.entry(T0.0 / MIN).or_default() += 20;
        let t2 = t.plus_millis(1_000);
        sync(&mut s, &l, &mut store, t2);
        let three = FleetView {
            live: 3,
            ..FleetView::ALONE
        };
        let later = t2.plus_millis(2_000);
        assert_eq!(s.check_with(&l, later, 0, &three).count_after, 20 + 40);
        // One of the two left after that reply: half the rate is projected.
        let left = FleetView {
            live: 2,
            before: 3,
            dropped_at: t2.0 + 500,
            ..three
        };
        assert_eq!(s.check_with(&l, later, 0, &left).count_after, 20 + 20);
        // Alone now: nothing is; and a rate measured after the drop applies whole.
        let alone = FleetView { live: 1, ..left };
        assert_eq!(s.check_with(&l, later, 0, &alone).count_after, 20);
        assert_eq!(left.rate_factor(t2.0 + 600), 1.0);
    }
}
