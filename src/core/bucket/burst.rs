//! Burst reads of a token bucket (`window/prior.rs`, "Burst reads", for windows): while an entity
//! is young and its node runs into its prior, re-reads of the fleet's bucket a round trip
//! apart replace the prior with an even share of the room the last read left; once settled,
//! a node spending its allowance asks for the same reads, so a flood is split on them.

use super::{BucketState, Geometry};
use crate::core::clock::UnixMillis;
use crate::core::fleet_view::{FleetView, BURST_SPREAD, BURST_WINDOW_MS};
use crate::core::limit::Limit;

/// How far above its even share of the room a young node's burst reads let it go, at most
/// (a window's is `BURST_SLACK`, 1.7). A bucket's room at 20 replicas is a few tokens a
/// node, where a binomial share's spread is as large as the share. In the simulator's cold
/// burst (5× a burst of 200 in 100 ms over 20 replicas, six seeds, [`BUCKET_BURST_LAG`]
/// 0.35): 1.8 admitted 1.02–1.09× the exact bucket with 0.5–1.9 % false denials, 2.0
/// 1.02–1.09× with 0–1.4 %, 2.2 1.02–1.10× with 0–1.0 %, 2.5 1.05–1.12× with 0–0.5 %.
pub(super) const BUCKET_BURST_SLACK: f64 = 2.0;

/// The others' spends a reply does not show yet, in gaps between this node's replies at
/// the others' pace: less than a window's `BURST_LAG` (0.5). Two reads of a shard are
/// under way a millisecond apart (`global/sync/shard.rs`), so a bucket's reply is rarely half a
/// gap behind, and every token kept back from a room of a few a node is a false denial. In
/// the simulator's cold burst at 20 replicas, over 60 seeds: at 0.5, 1.01–1.09× the exact
/// bucket with false denials over 2 % on 26 seeds (worst 4.3 %); at 0.35, 1.02–1.10× with 7
/// over 2 % (worst 2.9 %); at 0.3, up to 1.10× and 2.9 %. The warm flood at 4 replicas went
/// from 1.9 to 1.0 % false denials on the six seeds; the other scenarios did not move.
const BUCKET_BURST_LAG: f64 = 0.35;

/// How much of a settled node's allowance it spends before it wants a burst read: the read
/// is a round trip away, and the hits meanwhile spend the rest. In the simulator's warm flood
/// at 20 replicas: at 0.5 (and the reads' pace then taken off the room) 1.15–1.21× the exact
/// bucket, each node spending most of its spread before the others' spends were in a read.
/// With the floods' spread shrinking ([`super::FLOOD_PACE`]) and runs absorbed, over 24
/// seeds: at 0.25, 1.072–1.134× (15 seeds past 1.10×) with false denials over 2 % on 2; at
/// 0.18, 1.067–1.110× (3) and 6; at 0.15, up to 1.100× (1) and 4; at 0.125, 1.062–1.096× (none)
/// and 5 (at most 3.3 %): the earlier a node re-reads, the less of the flood it spends on a
/// stale read, and the more often a node whose share of the room was spent denies while
/// another's was not. On the six seeds the tests check, 1.067–1.091× at 0.5–1.9 % (1.086–1.124×
/// at 0.25); the other scenarios within 0.01× and 0.5 points of false denials either way.
const SETTLED_READ_AT: f64 = 0.125;

impl BucketState {
    /// Whether this node should re-read this young bucket before the next tick: within
    /// [`BURST_WINDOW_MS`] of its first reply, its own spends since that reply are a quarter
    /// of its prior or more (its own bucket's debt), and the last reply left room. Unlike a window's, no least prior:
    /// a bucket's burst shared by 20 replicas is a prior of a token or two, the very case a
    /// prior decides worst.
    pub fn wants_burst_read(&self, limit: &Limit, now: UnixMillis, fleet: &FleetView) -> bool {
        let g = Geometry::of(limit);
        if self.synced_at == 0 || fleet.live <= 1 {
            return false;
        }
        if !self.young(fleet) {
            return self.settled_wants_read(&g, now, fleet);
        }
        if u64::from(self.age_ms) >= BURST_WINDOW_MS {
            return false;
        }
        // The own bucket's debt: this node's young spends, less their refill.
        let own_g = super::own_geometry(&g, fleet);
        let now_ns = now.0.saturating_mul(super::NS_PER_MS);
        let own = self.own_tat.saturating_sub(now_ns) / own_g.interval_ns.max(1);
        let prior = fleet.prior(g.burst);
        own.saturating_mul(4) >= prior && self.room_read(&g, now, fleet) >= 1.0
    }

    /// A settled node: whether its spends since its last reply are [`SETTLED_READ_AT`] of its
    /// allowance (or of its even share of the room, if less) or more, and that reply left
    /// room; or it would deny its next hit while the fleet's bucket had refilled a token
    /// since (its allowance starved on a stale pace or a room split below a token each).
    fn settled_wants_read(&self, g: &Geometry, now: UnixMillis, fleet: &FleetView) -> bool {
        let Some(allowed) = self.settled_allowance(g, now, fleet) else {
            return false;
        };
        let own = self.inflight.saturating_add(self.pending).max(0) as f64;
        let room = self.room_read(g, now, fleet);
        // Early by the even share too: a measured share above it is noise as often as not,
        // and a flood everywhere at once is split on reads, not on shares measured before it.
        let even = room / f64::from(fleet.live.max(1));
        let spending = own >= 1.0 && own >= SETTLED_READ_AT * allowed.min(even + 1.0);
        let starved = own + 1.0 > allowed + self.rounding()
            && self.room_since_read(g, now, fleet.tick_ms) >= 1.0;
        (spending && room >= 1.0) || starved
    }

    /// Whether a settled bucket's sync is due now, for the shard's burst reads and ticks
    /// (`tier.rs`), without the fleet's view: its pending spends are [`SETTLED_READ_AT`] of
    /// its measured share of the room or more, or with none pending its measured share is
    /// under a token of a room of one or more (starved). Without `live` it cannot check the
    /// even share [`BucketState::wants_burst_read`] also reads on: a node whose measured
    /// share is above the even one may want a read before it is due.
    pub fn read_due(&self, limit: &Limit, now: UnixMillis, tick_ms: u64) -> bool {
        if self.synced_at == 0 || self.inflight != 0 {
            return false;
        }
        let own = f64::from(self.own_per_sec);
        let all = own + f64::from(self.others_per_sec);
        if all <= 0.0 || own >= all {
            return false;
        }
        let g = Geometry::of(limit);
        // The refill since the read counts only up to a full bucket plus what the fleet spent
        // since (the rest overflowed): a full bucket read long ago is due on its share of the
        // burst, not of the whole refill since.
        let since_ms = now.0.saturating_sub(self.synced_at) as f64;
        let pending = self.pending.max(0) as f64;
        let full = f64::from(g.burst) + pending + all * since_ms / 1000.0;
        let room = self.room_since_read(&g, now, tick_ms).min(full).max(0.0);
        let share = own / all;
        if pending == 0.0 {
            return room >= 1.0 && share * room < 1.0;
        }
        pending >= SETTLED_READ_AT * share * room
    }

    /// Whether `hits` more would take this young node's spends since its last reply past its
    /// share of the room that reply left: `room / live`, plus [`BURST_SPREAD`] binomial
    /// deviations, at most [`BUCKET_BURST_SLACK`] times the even share.
    pub(super) fn over_burst_share(
        &self,
        g: &Geometry,
        now: UnixMillis,
        hits: u64,
        fleet: &FleetView,
    ) -> bool {
        let own = self.inflight.saturating_add(self.pending).max(0) as f64;
        let even = self.room_read(g, now, fleet) / f64::from(fleet.live.max(1));
        let spread = (BURST_SPREAD * even.sqrt()).min((BUCKET_BURST_SLACK - 1.0) * even);
        own + hits as f64 > even + spread + self.rounding()
    }

    /// The room the last reply left, with the refill since: the burst less what the bucket
    /// owed then, less the others' spends it does not show yet ([`BUCKET_BURST_LAG`]).
    pub(super) fn room_read(&self, g: &Geometry, now: UnixMillis, fleet: &FleetView) -> f64 {
        let rate = f64::from(self.others_pace) * fleet.rate_factor(self.synced_at);
        let gap = u64::from(self.gap_ms).min(fleet.tick_ms) as f64;
        let unsent = rate * BUCKET_BURST_LAG * gap / 1000.0;
        (self.room_since_read(g, now, fleet.tick_ms) - unsent).max(0.0)
    }
}
