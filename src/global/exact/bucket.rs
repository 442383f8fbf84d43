//! Exact rules' token buckets (docs/global.md, "Exact rules"): the store-independent steps of one
//! bucket item, which the in-memory store runs (`exact::apply`) and the Lua script mirrors
//! (`global/redis/exact.rs`, `exact.lua`).
//!
//! The store keeps the bucket's `tat` (`core/bucket/`: the moment it is full again). With
//! `owed = max(tat − now, 0)` and `T` the refill interval, `h` tokens fit when
//! `owed + h·T ≤ burst·T`; spending them makes `owed + h·T` owed (`tat = max(tat, now) + h·T`);
//! a refund makes `max(owed − h·T, 0)` owed (`tat = max(tat − h·T, now)`), never past full.
//! Only admitted tokens are spent: exact rules are never `strict`, so no debt below empty.
//! All in whole nanoseconds with local mode's arithmetic (`core/gcra.rs`), so the two agree
//! to the token.

use super::ExactItem;
use crate::core::gcra::{self, Geometry};

/// How long a bucket's key outlives the moment it is full again (ms): a replica whose clock is
/// a little behind still finds the `tat` it would count from. Past it, the key is gone, which
/// reads as full, as the bucket is by then.
pub const EXPIRY_MARGIN_MS: u64 = 1_000;

/// What an exact item needs beyond a window's fields to be a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactBucket {
    /// The capacity in tokens.
    pub burst: u32,
    /// The request's time (Unix µs; whole milliseconds, as the clock gives them).
    pub now_us: u64,
}

impl ExactBucket {
    /// The request's time in Unix ns.
    pub fn now_ns(&self) -> u64 {
        self.now_us.saturating_mul(1000)
    }
}

/// The item's refill interval and capacity (ns), as local mode sizes them.
pub fn geometry(it: &ExactItem) -> Geometry {
    Geometry::of(&it.limit())
}

/// `h·T` (ns), saturating.
fn need(it: &ExactItem, g: &Geometry) -> u64 {
    it.hits.saturating_mul(g.interval_ns)
}

/// Whether the item's tokens fit a bucket that owes `owed_ns` (a limit of 0 never fits).
pub fn fits(it: &ExactItem, owed_ns: u64) -> bool {
    let g = geometry(it);
    it.requests_per_unit != 0 && gcra::fits(&g, owed_ns, need(it, &g))
}

/// What the bucket owes (ns) once the item's tokens are spent (after they fit: at most its
/// capacity, as exact rules are never strict). The steps count from the request's time, as 0.
pub fn spent(it: &ExactItem, owed_ns: u64) -> u64 {
    let g = geometry(it);
    gcra::spend(owed_ns, 0, 0, need(it, &g), g.capacity_ns)
}

/// What the bucket owes (ns) once the item's tokens are given back, never past full.
pub fn refunded(it: &ExactItem, owed_ns: u64) -> u64 {
    crate::core::exact::refunded(&it.limit(), it.hits, owed_ns)
}

/// The expiry of a bucket's key that owes `owed_ns` (ms): until it is full again, and the
/// margin.
pub fn ttl_ms(owed_ns: u64) -> u64 {
    owed_ns.div_ceil(1_000_000).saturating_add(EXPIRY_MARGIN_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::bucket::verdict_owed;
    use crate::core::clock::UnixMillis;

    const NOW: UnixMillis = UnixMillis(1_700_006_400_000);

    /// `hits` of a bucket of `burst` refilling `rpu` a second.
    fn item(rpu: u32, burst: u32, hits: u64) -> ExactItem {
        ExactItem {
            entity: 1,
            limit: 0,
            epoch: 0,
            window_ms: 1000,
            left_ms: 0,
            prev: crate::core::window::Prev::Out,
            requests_per_unit: rpu,
            hits,
            ttl_ms: 0,
            refund: false,
            bucket: Some(ExactBucket {
                burst,
                now_us: NOW.0 * 1000,
            }),
            per_second: true,
        }
    }

    #[test]
    fn a_full_bucket_takes_exactly_its_burst_then_one_token_per_interval() {
        // 3 a second: T = 333,333,333 ns, not a whole number of microseconds.
        let it = item(3, 10, 1);
        let mut owed = 0;
        let mut admitted = 0;
        for _ in 0..20 {
            if fits(&it, owed) {
                owed = spent(&it, owed);
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10);
        assert_eq!(owed, 10 * 333_333_333);
        // 334 ms later one token has come back (333 ms is not quite enough).
        assert!(!fits(&it, owed - 333_000_000));
        assert!(fits(&it, owed - 334_000_000));
    }

    #[test]
    fn the_decision_is_local_modes_to_the_nanosecond() {
        for (rpu, burst, hits) in [(3, 10, 1), (3, 10, 4), (1, 100, 1), (7, 1, 1), (5, 5, 6)] {
            let it = item(rpu, burst, hits);
            let g = geometry(&it);
            for owed in [0, 1, g.interval_ns - 1, g.interval_ns, g.capacity_ns - 1] {
                let v = verdict_owed(&it.limit(), NOW, owed, hits);
                assert_eq!(fits(&it, owed), !v.over, "{rpu} {burst} {hits} {owed}");
            }
        }
        assert!(!fits(&item(0, 10, 1), 0), "a limit of 0 never fits");
        assert!(fits(&item(3, 10, 0), 0), "0 tokens fit a bucket with room");
    }

    #[test]
    fn a_refund_never_goes_past_full() {
        let it = item(1, 100, 5);
        assert_eq!(refunded(&it, 7_000_000_000), 2_000_000_000);
        assert_eq!(refunded(&it, 3_000_000_000), 0);
        assert_eq!(refunded(&it, 0), 0);
    }

    #[test]
    fn a_key_lives_until_full_again_and_the_margin() {
        assert_eq!(ttl_ms(0), EXPIRY_MARGIN_MS);
        assert_eq!(ttl_ms(1), 1 + EXPIRY_MARGIN_MS);
        assert_eq!(ttl_ms(3_600_000_000_000), 3_600_000 + EXPIRY_MARGIN_MS);
    }
}
