//! What a window decides from the fleet view (`fleet_view.rs`): the **prior** a cold entity
//! is decided on, the **burst reads** that re-split the room while it is young, what an
//! entity young when a replica joins keeps to, and how much of the others' measured rate
//! still applies after replicas left.
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
//! measured from it (own hits over the fleet's count, `share.rs`) means something. The
//! measured shares take over then. That read holds the others' hits only up to their last
//! sync, so a node denying a young entity sends what it admitted at once
//! ([`WindowState::wants_sync_when_denied`]) rather than at its next tick.
//!
//! The price: in a burst that reaches the limit within the young period, a node whose share
//! of the burst is above `1 / N` denies hits while another, below it, still has room. The
//! fleet admits about the limit in all, but the exact limiter would have admitted the first
//! hits at whatever node they arrived: the difference is about `0.4 × sqrt((N − 1) / limit)`
//! of the limit with an even prior (the mean excess of N binomial shares).
//!
//! # Burst reads
//! A burst of a few thousand hits a second reaches the limit within a few round trips, not
//! a tick, so a node re-reads the count meanwhile: within [`BURST_WINDOW_MS`] of a young
//! entity's first reply, once its own hits are a quarter of its prior, each hit wakes the
//! shard's task for a *burst read* (at most one per shard every 2 ms, one call carrying
//! every due entity, two under way at once, `global/sync/shard.rs`) until a reply shows the room
//! gone. Every replica hit by the burst does the same, so each reply holds the others' hits
//! up to about half a round trip before. A fresh burst read (within [`BURST_FRESH`] gaps)
//! replaces the prior: the node spends its even share, with a binomial share's spread
//! ([`BURST_SPREAD`], at most [`BURST_SLACK`]), of the room that read left (the limit less
//! the count read, less the others' hits it does not show yet at their measured rate), its
//! own hits since the read counting against it. Any other young reply bounds the node by
//! that share too, besides the prior. So the prior's binomial error applies only to the hits
//! of the last round trip before the limit, not to the whole burst: in the simulator's
//! bursts (six seeds), false denials fell from 3.5–5.4 % to 0–0.5 % at 20 replicas and from
//! 5.2–8.5 % to 0.7–1.8 % at 50, at 1.08–1.09× the limit. What is left is that last round
//! trip's hits, spread binomially: no read can show them before they are decided.
//!
//! # Surges that reach the limit after the fleet settled
//! A surge of a few hundred hits a second on a small limit (two replicas at 400 a second
//! on 600 an hour) reaches it one to two seconds in: past the burst reads' window, after
//! some replicas settled. A settled replica's share of the room is taken on a read that
//! holds the others' hits up to their last sync, up to a tick of their traffic behind,
//! which there is a good part of the limit; the fleet admitted up to 1.25× (30 seeds). So
//! a young replica sends its hits once they are a quarter of its prior
//! ([`WindowState::wants_early_send`], a send trip, `global/sync/shard.rs`), a settled one whose
//! others add 5 % of the limit or more in a tick re-reads the count, sending its own, as it
//! spends an eighth of its share of the room (`share.rs`, `WindowState::read_due`), and a
//! rate sample over less than a second is blended with the rate before (the others' syncs
//! land in lumps). The two slow surges of the simulator then admit 1.000–1.003× (30 seeds).
//!
//! # Replicas joining while an entity is young
//! A replica joining the fleet serves once every running replica's heartbeat has counted it
//! (`global/join.rs`): up to a tick after the first of them did. On the count that includes
//! it, a running replica would keep an entity young there to its share among replicas of
//! which one is not serving yet (a third of the limit, not half, on three), and deny hits
//! the exact limiter admits. In the simulator's *join mid-surge* (two running replicas, a
//! third starting within the first 400 ms of 1,000 requests a second on 600 an hour), that
//! was up to 19 % of the limit (six seeds), admitted later in the window, or with `strict`
//! on never (0.873×). So an entity whose first reply came no later than the heartbeat reply
//! that showed the last rise keeps the prior of the count before it
//! ([`FleetView::prior_since`]): those replicas served it alone so far, and the newcomer,
//! when it serves, finds their hits in its first reply and takes its share of the room that
//! leaves, not of the limit. The priors then no longer cap the fleet's total at 1.05× (the
//! newcomer's comes on top of theirs), so such an entity takes its even share of the room
//! each reply leaves, without the binomial spread: with the spread, 1.035–1.090× over six
//! seeds (1.103× over 30); without it, 1.003–1.070× (1.070× over 30), false denials at most
//! 1.2 %, `strict` or not. Its sends and burst reads keep to a quarter of the prior on the
//! count now, not before: sent later, its hits were missing from more of the others' reads
//! (up to 1.102× over six seeds, with the spread).
//!
//! # Departures
//! The others' rate is measured between replies and extrapolated until the next one; after a
//! replica leaves (its heartbeat removed or expired) the rate measured before includes its
//! traffic. Until the next reply re-measures it, a rate measured before the drop is scaled by
//! `(live − 1) / (before − 1)`: the departed replicas' part of it, taken as even, is no
//! longer projected forward.

use super::{Limit, Slot, WindowState};
use crate::core::clock::UnixMillis;
use crate::core::fleet_view::{
    FleetView, BURST_MIN_OWN, BURST_SPREAD, BURST_WINDOW_MS, MIN_SAMPLE_MS,
};

/// How many gaps between burst reads a burst read decides alone: past that (the reads
/// stopped, or the store is unreachable) the prior bounds the node again too.
const BURST_FRESH: u64 = 4;

/// How far above its even share of the room a reply left a young entity's node may go, at
/// most (see [`BURST_SPREAD`]). The room a burst read leaves is what the fleet has left half
/// a round trip or so before the limit is reached; the hits still to come land on the
/// replicas in binomial shares, as the whole burst does on the prior. The slack trades false
/// denials for over-admission on that much smaller remainder: in the simulator's bursts (six
/// seeds, two reads under way; without the spread), 1.3 admitted 1.03–1.05× with 2.0–3.5 % false denials at 50
/// replicas, 1.5 1.06–1.07× with 1.5–2.5 %, 1.7 1.08–1.09× with 0.7–1.8 % (a read at a
/// time, 1.7 admitted 1.09–1.12×).
const BURST_SLACK: f64 = 1.7;

/// The others' hits a reply does not show yet, in gaps between this node's replies at the
/// others' measured rate: a replica's hits since its last call, half a gap on average when
/// all the replicas hit by a burst re-read as often.
const BURST_LAG: f64 = 0.5;

// === impl WindowState ===

impl WindowState {
    /// Whether the first reply is at least `tick_ms` old (capped at 65 s): the count read
    /// shows every replica's hits, and a share measured on it means something.
    #[inline]
    pub fn settled(&self, tick_ms: u64) -> bool {
        self.synced_at != 0 && u64::from(self.age_ms) >= tick_ms.min(u64::from(u16::MAX))
    }

    /// Whether decisions on this limit still keep to the prior (see the module docs).
    #[inline]
    pub(super) fn young(&self, fleet: &FleetView) -> bool {
        fleet.live > 1 && !self.settled(fleet.tick_ms)
    }

    /// Whether `hits` more would go past what a young entity may admit: its even share of
    /// the room the last reply left and, unless that reply is a fresh burst read, its prior
    /// (see the module docs).
    #[inline]
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
        if self.synced_at != 0 && self.over_burst_share(limit, now, epoch, hits, fleet) {
            return true;
        }
        let since = now.0.saturating_sub(self.synced_at);
        if self.burst_read() && since <= BURST_FRESH * u64::from(self.gap_ms) {
            return false;
        }
        let own = self.own_in_window(limit, now, epoch);
        let prior = fleet.prior_since(limit.requests_per_unit, self.first_reply_at());
        own.saturating_add(hits) > prior
    }

    /// Whether this node should re-read this entity's count before the next tick (a burst
    /// read): settled, as [`WindowState::read_due`] says (a surge on a small limit); young,
    /// within [`BURST_WINDOW_MS`] of its first reply, on a prior of at least
    /// twice [`BURST_MIN_OWN`], its own hits in the window are a quarter of its prior or more
    /// (and at least [`BURST_MIN_OWN`]), and the last reply
    /// left room: once the fleet is at the limit, re-reads change nothing.
    pub fn wants_burst_read(&self, limit: &Limit, now: UnixMillis, fleet: &FleetView) -> bool {
        if fleet.live > 1 && self.synced_at != 0 && !self.young(fleet) {
            return self.read_due(limit, now, fleet.tick_ms);
        }
        let window = u64::from(self.age_ms) < BURST_WINDOW_MS;
        if !self.young(fleet) || self.synced_at == 0 || !window {
            return false;
        }
        let epoch = self.epoch_at(limit, now);
        let own = self.own_in_window(limit, now, epoch);
        let prior = fleet.prior(limit.requests_per_unit);
        prior >= 2 * BURST_MIN_OWN
            && own >= (prior / 4).max(BURST_MIN_OWN)
            && self.room_read(limit, now, epoch, fleet) >= 1.0
    }

    /// Whether this young entity has own hits the store has not seen: once its node denies
    /// it (its prior, or its share of what a burst read left, spent), they should go at once
    /// (an early round trip, `global/sync/shard.rs`) rather than at its next tick. The other
    /// replicas settle a tick after their own first reply and then share the room their read
    /// leaves; a read that misses the hits this node admitted while young leaves them room
    /// that is spent already. On two replicas (a limit of 600 an hour, 1,000 requests a
    /// second alternating, `tests/global.rs`) a node whose tick came early in the surge
    /// settled on a read holding its own 315 and part of the other's, and the fleet admitted
    /// up to 1.31× the limit (the simulator, 40 seeds); sent when the node starts denying,
    /// its hits are in the store a round trip later, before the other settles.
    pub fn wants_sync_when_denied(&self, fleet: &FleetView) -> bool {
        self.young(fleet) && self.pending() > 0
    }

    /// Whether this young entity's unsent hits are a quarter of its prior or more (and at
    /// least [`BURST_MIN_OWN`]), past the burst reads' window (whose reads send them): they
    /// should go before the next tick, in a send trip (`global/sync/shard.rs`). The others settle
    /// on reads that hold this node's hits up to its last sync, and a young node syncs once a
    /// tick: a read just before its tick missed up to a tick of them, and on two replicas at
    /// 400 a second (600 an hour) the other replica took a share of room already spent.
    pub fn wants_early_send(&self, limit: &Limit, fleet: &FleetView) -> bool {
        let window = u64::from(self.age_ms) < BURST_WINDOW_MS;
        if !self.young(fleet) || self.synced_at == 0 || window {
            return false;
        }
        let prior = fleet.prior(limit.requests_per_unit);
        self.pending() >= ((prior / 4).max(BURST_MIN_OWN)) as i64
    }

    /// When the first reply arrived (Unix ms; 0: none yet): the last one, less the time
    /// between the first and the last.
    fn first_reply_at(&self) -> u64 {
        if self.synced_at == 0 {
            return 0;
        }
        self.synced_at.saturating_sub(u64::from(self.age_ms)).max(1)
    }

    /// Whether the last reply was a burst read: the gap between replies is a round trip's.
    pub(super) fn burst_read(&self) -> bool {
        self.gap_ms != 0 && u64::from(self.gap_ms) < MIN_SAMPLE_MS
    }

    /// Whether `hits` more would take this node's hits since its last reply past its share
    /// of the room that reply left: its even share `room / live`, plus [`BURST_SPREAD`]
    /// binomial deviations, at most [`BURST_SLACK`] times the even share.
    fn over_burst_share(
        &self,
        limit: &Limit,
        now: UnixMillis,
        epoch: u64,
        hits: u64,
        fleet: &FleetView,
    ) -> bool {
        let since = |_: usize, s: &Slot| (s.inflight + s.pending).max(0) as u64;
        let (since_prev, since_curr) = self.pair(epoch, since);
        let own = Self::window(limit, now, epoch, since_prev, since_curr);
        let room = self.room_read(limit, now, epoch, fleet);
        let even = room / f64::from(fleet.live.max(1));
        // A replica joined since the first reply: the priors no longer cap the fleet's total
        // (the newcomer's comes on top of the count before), so the shares must add up to
        // the room (see the module docs).
        let spread = if fleet.rose_since(self.first_reply_at()) {
            0.0
        } else {
            (BURST_SPREAD * even.sqrt()).min((BURST_SLACK - 1.0) * even)
        };
        let share = (even + spread) as u64;
        own.saturating_add(hits) > share
    }

    /// The room the last reply left: the limit less the count read and less the others' hits
    /// it does not show yet ([`BURST_LAG`]).
    fn room_read(&self, limit: &Limit, now: UnixMillis, epoch: u64, fleet: &FleetView) -> f64 {
        let (read_prev, read_curr) = self.pair(epoch, |_, s| s.remote);
        let read = Self::window(limit, now, epoch, read_prev, read_curr);
        let rate = f64::from(self.others_per_sec) * fleet.rate_factor(self.synced_at);
        let unsent = rate * BURST_LAG * f64::from(self.gap_ms) / 1000.0;
        (f64::from(limit.requests_per_unit) - read as f64 - unsent).max(0.0)
    }

    /// Own hits in the window at `now`, refunds of others' hits left out.
    fn own_in_window(&self, limit: &Limit, now: UnixMillis, epoch: u64) -> u64 {
        let (prev, curr) = self.pair(epoch, |i, _| u64::try_from(self.own[i]).unwrap_or(0));
        Self::window(limit, now, epoch, prev, curr)
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
    use crate::core::window::SyncPlan;
    use std::collections::HashMap;

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
    fn a_young_entity_denied_with_hits_unsent_wants_them_sent_at_once() {
        let l = sliding(100);
        let f = fleet(2);
        let mut store = HashMap::new();
        let mut s = WindowState::default();
        // Its prior spent before any reply: 52 hits the others cannot see yet.
        assert_eq!(admit(&mut s, &l, T0, &f), 52);
        assert!(s.wants_sync_when_denied(&f));
        // Sent: nothing left to hurry, until a strict denial counts one more.
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        assert!(!s.wants_sync_when_denied(&f));
        s.record(&l, T0.plus_millis(3), 1);
        assert!(s.wants_sync_when_denied(&f));
        // Alone there is no prior; settled, the share decides and the tier's cadence sends.
        assert!(!s.wants_sync_when_denied(&fleet(1)));
        sync(&mut s, &l, &mut store, T0.plus_millis(1_002));
        s.record(&l, T0.plus_millis(1_003), 1);
        assert!(!s.young(&f) && !s.wants_sync_when_denied(&f));
    }

    #[test]
    fn a_young_entity_sends_its_hits_at_a_quarter_of_its_prior_past_the_burst_window() {
        let l = sliding(1000);
        let f = fleet(2);
        let mut store = HashMap::new();
        let mut s = WindowState::default();
        let hits = |s: &mut WindowState, n, at| (0..n).for_each(|_| s.record(&l, at, 1));
        hits(&mut s, 10, T0);
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        // Within the burst window its burst reads send them: not yet.
        hits(&mut s, 200, T0.plus_millis(5));
        assert!(!s.wants_early_send(&l, &f));
        sync(&mut s, &l, &mut store, T0.plus_millis(150));
        // Past it, a quarter of its prior of 525 unsent: 131.
        hits(&mut s, 130, T0.plus_millis(200));
        assert!(!s.wants_early_send(&l, &f));
        hits(&mut s, 1, T0.plus_millis(201));
        assert!(s.wants_early_send(&l, &f));
        // Alone there is no prior; settled, the share and its reads take over.
        assert!(!s.wants_early_send(&l, &fleet(1)));
        sync(&mut s, &l, &mut store, T0.plus_millis(1_100));
        hits(&mut s, 200, T0.plus_millis(1_101));
        assert!(!s.young(&f) && !s.wants_early_send(&l, &f));
    }

    /// A burst read at `t`: a sync whose reply measures the others however soon it comes.
    fn burst_read(s: &mut WindowState, l: &Limit, store: &mut HashMap<u64, u64>, t: UnixMillis) {
        let mut plan = s.begin_sync(l, t);
        plan.burst = true;
        let totals = apply(store, &plan);
        s.complete_sync(l, &plan, totals, t);
    }

    #[test]
    fn a_fresh_burst_read_replaces_the_prior_with_a_share_of_the_room_left() {
        let l = sliding(1000);
        let f = fleet(4);
        let mut store = HashMap::new();
        let mut s = WindowState::default();
        // 100 hits, then the early trip's reply: young, not worth a re-read below a quarter
        // of the prior (262 / 4), worth one above it.
        for _ in 0..100 {
            s.record(&l, T0, 1);
        }
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        assert!(s.young(&f) && s.wants_burst_read(&l, T0.plus_millis(2), &f));
        // The others added 30 in the next 2 ms: 15 a millisecond, 15 more unsent at the read.
        // Room: 1000 - 130 - 15 = 855; this node's even share 855 / 4 = 213.75, with the
        // spread of a binomial share, 2 × sqrt(213.75) = 29.2 (under the slack's 0.7 ×
        // 213.75): 242 more, past its prior of 262 in all.
        *store.entry(T0.0 / MIN).or_default() += 30;
        burst_read(&mut s, &l, &mut store, T0.plus_millis(4));
        // Among 200 replicas the slack bounds the spread: 4.275 + 0.7 × 4.275 = 7.27.
        let (now, epoch) = (T0.plus_millis(4), T0.0 / MIN);
        assert!(!s.over_burst_share(&l, now, epoch, 7, &fleet(200)));
        assert!(s.over_burst_share(&l, now, epoch, 8, &fleet(200)));
        assert_eq!(admit(&mut s, &l, T0.plus_millis(4), &f), 242);
        // Four gaps later the read is stale: the prior bounds the node again.
        let stale = T0.plus_millis(4 + 4 * 2 + 1);
        assert!(!s.over_burst_share(&l, stale, T0.0 / MIN, 0, &f));
        assert_eq!(admit(&mut s, &l, stale, &f), 0);
    }

    #[test]
    fn two_burst_reads_in_flight_settle_exactly_whatever_the_order() {
        // Two reads of an entity under way at once (`global/sync/shard.rs`): the store may apply
        // them in either order (a pool of connections), and either may fail. Own hits are
        // counted once throughout, and exactly once both are settled.
        let l = sliding(1000);
        let (epoch, t) = (T0.0 / MIN, |ms| T0.plus_millis(ms));
        for (b_lands_first, b_fails) in [(false, false), (true, false), (false, true)] {
            let mut store = HashMap::new();
            let mut s = WindowState::default();
            for _ in 0..100 {
                s.record(&l, T0, 1);
            }
            sync(&mut s, &l, &mut store, t(2));
            // 10 hits go with read A, 5 more with read B, 3 wait.
            let hits = |s: &mut WindowState, n, at| (0..n).for_each(|_| s.record(&l, at, 1));
            hits(&mut s, 10, t(3));
            let a = SyncPlan {
                burst: true,
                ..s.begin_sync(&l, t(3))
            };
            hits(&mut s, 5, t(4));
            let b = SyncPlan {
                burst: true,
                ..s.begin_sync(&l, t(4))
            };
            hits(&mut s, 3, t(4));
            assert_eq!((a.deltas[0], b.deltas[0], b.parts[0].hits), (10, 5, 115));
            assert_eq!(s.count(epoch), 118);
            // The others add 20 before either lands.
            *store.entry(epoch).or_default() += 20;
            // B, when it fails, never lands.
            let (ta, tb) = if b_lands_first {
                let tb = Some(apply(&mut store, &b));
                (apply(&mut store, &a), tb)
            } else {
                let ta = apply(&mut store, &a);
                (ta, (!b_fails).then(|| apply(&mut store, &b)))
            };
            // A's reply first: what it shows is counted once, B's hits still in flight.
            s.complete_sync(&l, &a, ta, t(5));
            let shown = if b_lands_first { 5 } else { 0 };
            assert_eq!(s.count(epoch), 138 + shown);
            if b_fails {
                s.fail_sync(&b);
                assert_eq!((s.count(epoch), s.pending()), (138, 8));
            } else {
                s.complete_sync(&l, &b, tb.unwrap(), t(6));
                assert_eq!((s.count(epoch), s.pending()), (138, 3));
            }
            // Nothing left in flight: own hits less what is pending is what the store holds.
            let slot = &s.slots[(epoch % 2) as usize];
            assert_eq!(slot.inflight, 0);
            assert_eq!(slot.remote, store[&epoch]);
        }
    }

    #[test]
    fn burst_reads_stop_when_the_room_is_gone_or_the_window_is_past() {
        let l = sliding(1000);
        let f = fleet(4);
        let mut store = HashMap::new();
        let mut s = WindowState::default();
        for _ in 0..100 {
            s.record(&l, T0, 1);
        }
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        // The fleet is at the limit: nothing to re-split.
        *store.entry(T0.0 / MIN).or_default() += 900;
        burst_read(&mut s, &l, &mut store, T0.plus_millis(4));
        assert!(!s.wants_burst_read(&l, T0.plus_millis(4), &f));
        assert_eq!(admit(&mut s, &l, T0.plus_millis(4), &f), 0);
        // Another young entity, with room left but read after the burst window.
        let mut store = HashMap::new();
        let mut s = WindowState::default();
        for _ in 0..100 {
            s.record(&l, T0, 1);
        }
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        sync(&mut s, &l, &mut store, T0.plus_millis(2 + BURST_WINDOW_MS));
        assert!(s.young(&f) && !s.wants_burst_read(&l, T0.plus_millis(103), &f));
    }

    #[test]
    fn an_entity_young_before_a_replica_joined_keeps_the_prior_of_the_count_before() {
        // Two replicas on 600: 240 of this one's hits in the store, the others' none yet.
        let l = sliding(600);
        let mut store = HashMap::new();
        let mut s = WindowState::default();
        s.record(&l, T0, 1);
        sync(&mut s, &l, &mut store, T0.plus_millis(2));
        (0..239).for_each(|_| s.record(&l, T0.plus_millis(100), 1));
        sync(&mut s, &l, &mut store, T0.plus_millis(300));
        // A third registers, counted from T0 + 400 on; it serves later.
        let three = FleetView {
            live: 3,
            before_rise: 2,
            rose_at: T0.0 + 400,
            ..FleetView::ALONE
        };
        // On the count before: a prior of 315, 75 more (a third of the room left, 120, is
        // more). On the count of three, 210: it would deny what the exact limiter admits.
        let t = T0.plus_millis(500);
        assert_eq!(admit(&mut s.clone(), &l, t, &fleet(3)), 0);
        // And no spread on its share of the room: the even share, 360 / 3.
        let epoch = T0.0 / MIN;
        assert!(!s.over_burst_share(&l, t, epoch, 120, &three));
        assert!(s.over_burst_share(&l, t, epoch, 121, &three));
        assert!(!s.over_burst_share(&l, t, epoch, 141, &fleet(3)));
        assert_eq!(admit(&mut s, &l, t, &three), 75);
        // An entity with no reply before the rise is on the count of three.
        assert_eq!(admit(&mut WindowState::default(), &l, t, &three), 210);
        // A first reply with the heartbeat's that showed the rise (a tick's call carries
        // both) counts as before it; after a drop back, the lower count holds.
        assert!(three.rose_since(T0.0 + 400) && !three.rose_since(T0.0 + 401));
        let dropped = FleetView {
            live: 2,
            before_rise: 3,
            ..three
        };
        assert_eq!(dropped.prior_since(600, T0.0 + 2), 315);
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
