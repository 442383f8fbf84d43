//! The exact verdict: what one limit of an `exact: true` rule reports, given what the store
//! held for it before the call counted anything ([`StoreCounts`]) and whether the store said
//! its hits go over. Pure, beside `decide.rs`: the store call and the plan of items are
//! global mode's and `rls/exact.rs`'s; the arithmetic a refund gives back is here, so the
//! stores (`global/exact/`) and the verdict share one definition.

use crate::core::bucket::verdict_owed;
use crate::core::clock::UnixMillis;
use crate::core::gcra::{self, Geometry};
use crate::core::limit::{verdict_on, Limit, Verdict};
use crate::core::window::{window_count, Prev};

/// One limit's part of an exact call: the limit, the hits, and whether they are given back
/// (`is_negative_hits`) rather than checked and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactAsk {
    /// The limit.
    pub limit: Limit,
    /// Hits to check and count, or to give back.
    pub hits: u64,
    /// Give the hits back.
    pub refund: bool,
}

/// What the store held for one limit before the call counted anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// The previous epoch's count (0 for a fixed window or a bucket).
    pub prev: u64,
    /// The current epoch's count (0 for a bucket).
    pub curr: u64,
    /// A bucket: how far its `tat` was ahead of the request's time (ns; 0: full).
    pub owed_ns: u64,
}

/// What a refund of `hits` takes from a window's counts `[prev, curr]`: a concurrency limit's
/// from the previous epoch first (its window counts both whole), the others' from the
/// current one only; never below zero.
pub fn given_back(prev: Prev, hits: u64, held_prev: u64, held_curr: u64) -> [u64; 2] {
    let from_prev = if prev == Prev::Whole {
        hits.min(held_prev)
    } else {
        0
    };
    [from_prev, (hits - from_prev).min(held_curr)]
}

/// What a bucket owing `owed_ns` owes once `hits` tokens are given back.
pub fn refunded(limit: &Limit, hits: u64, owed_ns: u64) -> u64 {
    let g = Geometry::of(limit);
    gcra::give_back(owed_ns, 0, 0, hits.saturating_mul(g.interval_ns))
}

/// The ask's own verdict on what the store held (`held`): the window's formula, or the
/// bucket's (`core/bucket/`, as local mode reports it: remaining whole tokens, reset until
/// full, retry until the request would fit). A refund is reported with 0 hits on what it
/// leaves, as `core::decide` reports one.
pub fn natural(ask: &ExactAsk, now: UnixMillis, held: &StoreCounts) -> Verdict {
    let limit = &ask.limit;
    let bucket = matches!(limit.algorithm, crate::core::Algorithm::TokenBucket { .. });
    let (hits, c) = if ask.refund {
        let [prev, curr] = given_back(Prev::of(limit.algorithm), ask.hits, held.prev, held.curr);
        let left = StoreCounts {
            prev: held.prev - prev,
            curr: held.curr - curr,
            owed_ns: if bucket {
                refunded(limit, ask.hits, held.owed_ns)
            } else {
                0
            },
        };
        (0, left)
    } else {
        (ask.hits, *held)
    };
    if bucket {
        return verdict_owed(limit, now, c.owed_ns, hits);
    }
    let mut v = verdict_on(limit, now, window_count(limit, now, c.prev, c.curr), hits);
    v.retry_ms = if v.over { v.reset_ms } else { 0 };
    v
}

/// The verdict of an ask on what the store held, over when `over` says so (the store's
/// word: an ask that fits is reported on its counts with these hits, counted or not).
pub fn verdict(ask: &ExactAsk, now: UnixMillis, held: &StoreCounts, over: bool) -> Verdict {
    let mut v = natural(ask, now, held);
    if over != v.over {
        v.over = over;
        v.retry_ms = if over { v.reset_ms.max(1) } else { 0 };
    }
    if over {
        v.remaining = 0;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Algorithm;

    const NOW: UnixMillis = UnixMillis(1_700_006_400_000);

    fn ask(algorithm: Algorithm, hits: u64, refund: bool) -> ExactAsk {
        ExactAsk {
            limit: Limit {
                requests_per_unit: 10,
                window_ms: 60_000,
                algorithm,
            },
            hits,
            refund,
        }
    }

    #[test]
    fn a_window_reports_its_count_and_the_store_word_on_over_wins() {
        let held = StoreCounts {
            curr: 9,
            ..StoreCounts::default()
        };
        let a = ask(Algorithm::FixedWindow, 1, false);
        let v = natural(&a, NOW, &held);
        assert!(!v.over);
        assert_eq!((v.remaining, v.count_after, v.retry_ms), (0, 10, 0));
        let over = natural(&ask(Algorithm::FixedWindow, 2, false), NOW, &held);
        assert!(over.over && over.retry_ms == over.reset_ms);
        // The store said over (another replica's hits landed first): over, nothing left.
        let v = verdict(&a, NOW, &held, true);
        assert!(v.over && v.remaining == 0 && v.retry_ms >= 1);
    }

    #[test]
    fn a_refund_reports_what_it_leaves_and_never_goes_below_zero() {
        let held = StoreCounts {
            prev: 4,
            curr: 2,
            ..StoreCounts::default()
        };
        assert_eq!(given_back(Prev::Whole, 5, 4, 2), [4, 1]);
        assert_eq!(given_back(Prev::Out, 5, 4, 2), [0, 2]);
        let v = natural(&ask(Algorithm::FixedWindow, 5, true), NOW, &held);
        assert_eq!((v.count_after, v.remaining), (0, 10));
        let v = natural(&ask(Algorithm::Concurrency, 5, true), NOW, &held);
        assert_eq!(
            v.count_after, 1,
            "4 from the previous epoch, 1 from this one"
        );
    }

    #[test]
    fn a_bucket_owing_time_is_refunded_by_its_hits_refill_time() {
        let limit = ask(Algorithm::TokenBucket { burst: 10 }, 2, true).limit;
        // 10 a minute: a token is 6 s.
        assert_eq!(refunded(&limit, 2, 20_000_000_000), 8_000_000_000);
        assert_eq!(refunded(&limit, 2, 5_000_000_000), 0);
    }
}
