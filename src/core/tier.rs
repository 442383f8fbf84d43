//! Pressure tiers and the sync cadence they set: how often an entity with news syncs.

use super::clock::UnixMillis;
use super::limit::Limit;
use super::state::LimitState;

/// How close an entity is to its limit, which sets how often it syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Under 10 % of the limit.
    Idle,
    /// 10–50 %.
    Low,
    /// 50–80 %.
    Normal,
    /// Over 80 %.
    Hot,
}

impl Tier {
    /// The tier of a pressure (estimate / limit).
    pub fn of(pressure: f64) -> Tier {
        if pressure < 0.1 {
            Tier::Idle
        } else if pressure < 0.5 {
            Tier::Low
        } else if pressure <= 0.8 {
            Tier::Normal
        } else {
            Tier::Hot
        }
    }
}

/// When an entity syncs: every `tick_ms` the sync task looks at the entities with news, and
/// syncs those whose tier's interval has passed since their last sync. A sync both writes the
/// pending hits and reads the fleet's counts (one script per shard does both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPolicy {
    /// The tick of the sync task.
    pub tick_ms: u64,
    /// The base interval: Normal syncs this often, Low every 4×, Idle every 8×, Hot every tick.
    pub base_ms: u64,
}

impl Default for SyncPolicy {
    fn default() -> Self {
        SyncPolicy {
            tick_ms: 1000,
            base_ms: 2000,
        }
    }
}

impl SyncPolicy {
    /// How long an entity of `tier` waits between syncs.
    pub fn interval_ms(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Idle => 8 * self.base_ms,
            Tier::Low => 4 * self.base_ms,
            Tier::Normal => self.base_ms,
            Tier::Hot => self.tick_ms,
        }
    }

    /// Whether a limit state last synced at `last_sync_ms` is due at `now`.
    ///
    /// - Until the others' rate is known ([`WindowState::warm`]: never synced, or synced
    ///   once) and the first reply is a tick old ([`WindowState::settled`]: the prior holds
    ///   until then, `window/prior.rs`), every tick: a cold entity learns the fleet's count at once
    ///   (an early round trip) and the others' rate on the next tick, which is what keeps a
    ///   surge spread over many nodes from running far past the limit before any node
    ///   notices.
    /// - Then at its tier's interval — the tier the pressure is expected to reach by the end
    ///   of that interval ([`WindowState::pressure_ahead`]) when that is higher: an entity
    ///   that will be Hot before its next sync is Hot now.
    /// - Before that, between ticks (the shard's burst reads): a settled bucket spending its
    ///   share of the room, and a settled window spending its share in a surge on a small
    ///   limit ([`WindowState::read_due`]).
    pub fn due(
        &self,
        state: &LimitState,
        limit: &Limit,
        now: UnixMillis,
        last_sync_ms: u64,
    ) -> bool {
        if !state.warm() || !state.settled(self.tick_ms) {
            return true;
        }
        // A settled bucket spending its share of the room re-reads it before the tick, and so
        // does a window in a surge that brings the others a good part of the limit a tick.
        match state {
            LimitState::Bucket(b) if b.read_due(limit, now, self.tick_ms) => return true,
            LimitState::Window(w) if w.read_due(limit, now, self.tick_ms) => return true,
            _ => {}
        }
        let elapsed = now.0.saturating_sub(last_sync_ms) + self.tick_ms / 2;
        let tier = Tier::of(state.pressure(limit, now));
        if elapsed >= self.interval_ms(tier) {
            return true;
        }
        let ahead = state.pressure_ahead(limit, now, self.interval_ms(tier), self.tick_ms);
        elapsed >= self.interval_ms(Tier::of(ahead).max(tier))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::*;
    use crate::core::window::WindowState;

    #[test]
    fn a_cold_entity_syncs_every_tick_until_the_rate_is_known() {
        let l = sliding(1000);
        let policy = SyncPolicy::default();
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        let t = T0.plus_millis(5_000);
        hit(&mut s, &l, t, 1);
        assert!(policy.due(&LimitState::Window(s), &l, t, 0), "never synced");
        sync(&mut s, &l, &mut store, t);
        let tick = t.plus_millis(policy.tick_ms);
        assert!(
            policy.due(&LimitState::Window(s), &l, tick, t.0),
            "one reply: the rate is a guess"
        );
        sync(&mut s, &l, &mut store, tick);
        // Warm and idle: the next sync waits for the Idle interval.
        let next = tick.plus_millis(policy.tick_ms);
        assert!(!policy.due(&LimitState::Window(s), &l, next, tick.0));
        let idle = tick.plus_millis(policy.interval_ms(Tier::Idle));
        assert!(policy.due(&LimitState::Window(s), &l, idle, tick.0));
    }

    #[test]
    fn an_entity_syncs_every_tick_until_its_first_reply_is_a_tick_old() {
        let l = sliding(1000);
        let policy = SyncPolicy::default();
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        // An early round trip, then a tick 300 ms later: the rate is measured (warm), but
        // the count read may not show the others' hits yet.
        let t = T0.plus_millis(5_000);
        hit(&mut s, &l, t, 1);
        sync(&mut s, &l, &mut store, t);
        let t2 = t.plus_millis(300);
        sync(&mut s, &l, &mut store, t2);
        assert!(s.warm() && !s.settled(policy.tick_ms));
        let next = t2.plus_millis(policy.tick_ms);
        assert!(
            policy.due(&LimitState::Window(s), &l, next, t2.0),
            "still young"
        );
        sync(&mut s, &l, &mut store, next);
        assert!(s.settled(policy.tick_ms));
        assert!(!policy.due(
            &LimitState::Window(s),
            &l,
            next.plus_millis(policy.tick_ms),
            next.0
        ));
    }

    #[test]
    fn a_surge_seen_on_this_node_makes_the_entity_hot_before_the_count_shows_it() {
        let l = sliding(1000);
        let policy = SyncPolicy::default();
        let mut store = std::collections::HashMap::new();
        let mut s = WindowState::default();
        // A quiet entity: this node has 1 of the fleet's 20 hits, read twice 1 s apart.
        *store.entry(T0.0 / MIN).or_default() += 19;
        let t = T0.plus_millis(10_000);
        hit(&mut s, &l, t, 1);
        sync(&mut s, &l, &mut store, t);
        let t2 = t.plus_millis(1_000);
        sync(&mut s, &l, &mut store, t2);
        assert_eq!(Tier::of(s.pressure(&l, t2)), Tier::Idle);
        // Then 30 hits here within a tick: with its 5 % share of the count, the fleet is
        // likely to be taking about 600 a second — Hot within the Idle interval.
        let t3 = t2.plus_millis(policy.tick_ms);
        for _ in 0..30 {
            hit(&mut s, &l, t3, 1);
        }
        assert_eq!(Tier::of(s.pressure(&l, t3)), Tier::Idle);
        assert!(policy.due(&LimitState::Window(s), &l, t3, t2.0));
    }
}
