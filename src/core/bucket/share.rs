//! A token bucket's guards in global mode (see the module docs of `bucket/`): the others'
//! spends extrapolated since the last reply, the prior of a young node, and the share of
//! the room a settled node spends, with its spread and its rounding.

use super::*;

// === impl BucketState ===

impl BucketState {
    /// The others' spends expected since the last reply at their measured rate (ns).
    pub(super) fn others_since(&self, g: &Geometry, now: UnixMillis, fleet: &FleetView) -> u64 {
        if self.synced_at == 0 || self.others_per_sec <= 0.0 {
            return 0;
        }
        let factor = fleet.rate_factor(self.synced_at);
        let ms = now.0.saturating_sub(self.synced_at) as f64;
        let tokens = f64::from(self.others_per_sec) * factor * ms / 1000.0;
        (tokens * g.interval_ns as f64).min(g.max_ahead_ns as f64) as u64
    }

    pub(super) fn young(&self, fleet: &FleetView) -> bool {
        fleet.live > 1 && !self.settled(fleet.tick_ms)
    }

    /// While young: whether `hits` more would overdraw this node's own bucket of its prior
    /// share (see the module docs).
    pub(super) fn over_prior(
        &self,
        g: &Geometry,
        now: UnixMillis,
        hits: u64,
        fleet: &FleetView,
    ) -> bool {
        if !self.young(fleet) {
            return false;
        }
        // Once a reply came, its room decides (burst reads, `burst.rs`).
        if self.synced_at != 0 {
            return self.over_burst_share(g, now, hits, fleet);
        }
        let own = own_geometry(g, fleet);
        let now_ns = now.0.saturating_mul(NS_PER_MS);
        self.own_tat
            .saturating_sub(now_ns)
            .saturating_add(own.span(hits))
            > own.capacity_ns
    }

    /// Once settled, in a fleet: whether `hits` more would take this node's spends since its
    /// last reply past its allowance ([`BucketState::settled_allowance`]).
    pub(super) fn over_share(
        &self,
        g: &Geometry,
        now: UnixMillis,
        hits: u64,
        fleet: &FleetView,
    ) -> bool {
        if self.synced_at == 0 || self.young(fleet) {
            return false;
        }
        let Some(allowed) = self.settled_allowance(g, now, fleet) else {
            return false;
        };
        let own = self.inflight.saturating_add(self.pending).max(0) as f64;
        own + hits as f64 > allowed + self.rounding()
    }

    /// A settled node's allowance since its last reply: its share of the room the fleet's
    /// bucket has had since then, plus a binomial share's spread of at most
    /// [`burst::BUCKET_BURST_SLACK`]'s part of that share. `None`: this node has the whole
    /// bucket. Spending a part of it wants a burst read (`burst.rs`), so the room is
    /// re-split a round trip later rather than a tick.
    pub(super) fn settled_allowance(
        &self,
        g: &Geometry,
        now: UnixMillis,
        fleet: &FleetView,
    ) -> Option<f64> {
        let share = self.share(fleet);
        if share >= 1.0 {
            return None;
        }
        let rate = f64::from(self.others_per_sec) * fleet.rate_factor(self.synced_at);
        // The others sync every tick while they spend (`pressure_ahead`): at most a tick's
        // spends each, half of one on average, were not in the store when it was read.
        let half_gap = u64::from(self.gap_ms).min(fleet.tick_ms) as f64 / 2.0;
        let unsent = UNSENT_RESERVED * rate * half_gap / 1000.0;
        let room = (self.room_since_read(g, now, fleet.tick_ms) - unsent).max(0.0);
        let even = share * room;
        // A flood needs no spread: every node has hits for its share and more.
        let pace = f64::from(self.others_pace) * fleet.rate_factor(self.synced_at);
        let damp = (FLOOD_PACE * g.refill_per_sec() / pace.max(f64::MIN_POSITIVE)).min(1.0);
        let spread =
            damp * (SHARE_SPREAD * even.sqrt()).min((burst::BUCKET_BURST_SLACK - 1.0) * even);
        Some(even + spread)
    }

    /// The tokens the fleet's bucket owed when the last reply read it (above the burst: in
    /// debt).
    fn owed_at_read(&self, g: &Geometry) -> f64 {
        let read_ns = self.synced_at.saturating_mul(NS_PER_MS);
        self.remote.saturating_sub(read_ns) as f64 / g.interval_ns as f64
    }

    /// The tokens the fleet may have spent since the last reply: what the bucket held then
    /// (below 0 in debt) and its refill since. Not capped at the burst: a fleet that keeps
    /// spending keeps the bucket from filling, so the whole refill is spendable. A bucket
    /// left full wastes its refill, so that refill stops a gap (at least a tick) after the
    /// reply, when another is due; past it, the room is the refill since the read up to a
    /// full bucket (a node that had nothing to sync during a pause still reads the bucket it
    /// emptied, long refilled since).
    pub(super) fn room_since_read(&self, g: &Geometry, now: UnixMillis, tick_ms: u64) -> f64 {
        let owed = self.owed_at_read(g);
        let horizon = u64::from(self.gap_ms).max(tick_ms);
        let elapsed = now.0.saturating_sub(self.synced_at).min(horizon);
        let refill = (elapsed.saturating_mul(NS_PER_MS)) as f64 / g.interval_ns as f64;
        // A read older than that: the whole refill since, up to a full bucket. After a pause
        // the bucket is full again, whatever was read, and the shares split all of it.
        let all_ns = now
            .0
            .saturating_sub(self.synced_at)
            .saturating_mul(NS_PER_MS);
        let since = (f64::from(g.burst) - owed + all_ns as f64 / g.interval_ns as f64)
            .min(f64::from(g.burst));
        (f64::from(g.burst) - owed + refill).max(since)
    }

    /// The fraction of a token below which a share rounds down, in [0, 1): each node rounds
    /// with an offset of its own (from its last reply's time), so that over the fleet the
    /// fractions of a token cancel out rather than all round alike.
    pub(super) fn rounding(&self) -> f64 {
        (self.synced_at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// This node's part of the fleet's recent spending; `1 / live` before any was measured.
    fn share(&self, fleet: &FleetView) -> f64 {
        let own = f64::from(self.own_per_sec);
        let all = own + f64::from(self.others_per_sec) * fleet.rate_factor(self.synced_at);
        if fleet.live <= 1 && self.others_per_sec <= 0.0 {
            return 1.0;
        }
        if all <= 0.0 {
            return fleet.prior_share();
        }
        (own / all).clamp(SHARE_FLOOR.max(EVEN_FLOOR * fleet.prior_share()), 1.0)
    }
}
