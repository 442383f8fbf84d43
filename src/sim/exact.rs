//! The exact references the simulator measures the fleet against: the window formula over
//! the fleet's true counted hits, and a token bucket of our own writing. Models on purpose:
//! they are the yardstick, so they must not share sluice's code.
//!
//! Both count *false denials* the same way: a hit the fleet denied that the exact algorithm,
//! fed with the fleet's admitted hits plus the false denials counted so far as admitted,
//! would have let in. A false denial enters that oracle as if admitted, so a free slot (or
//! token) refused to ten requests in a row counts once — the one hit the fleet failed to
//! admit — not ten times; [`WindowStats::denied_with_room`] keeps the raw per-request figure.
//!
//! For a bucket, a third model runs beside them: an exact bucket fed every arrival alone
//! (the "exact bucket" the fleet is compared with), whose admitted hits per period are
//! [`WindowStats::exact_admitted`].

use super::{period_ms, Scenario, WindowStats};
use crate::core::{Algorithm, Limit};

/// The exact reference of one run, window or bucket, and the stats it keeps per period.
pub struct Exact {
    limit: Limit,
    /// The run's start (Unix ms), on a window boundary.
    t0: u64,
    /// Whether denied hits count too: a fixed window's, or a `strict` sliding window's.
    counts_denied: bool,
    period_ms: u64,
    kind: Kind,
    /// The stats, period by period.
    pub stats: Vec<WindowStats>,
}

enum Kind {
    /// Per epoch: the fleet's true counted hits, and the same with the false denials.
    Window { truth: Vec<u64>, oracle: Vec<u64> },
    /// The fleet's admitted hits; the same with the false denials; every arrival alone.
    Bucket {
        truth: ModelBucket,
        oracle: ModelBucket,
        alone: ModelBucket,
    },
}

impl Exact {
    /// The reference for `s`, before its first hit.
    pub fn new(s: &Scenario) -> Self {
        let epochs = s.windows as usize + 1;
        let kind = match s.limit.algorithm {
            Algorithm::TokenBucket { burst } => {
                let b = ModelBucket::full(s.limit.requests_per_unit, s.limit.window_ms, burst);
                Kind::Bucket {
                    truth: b,
                    oracle: b,
                    alone: b,
                }
            }
            _ => Kind::Window {
                truth: vec![0; epochs],
                oracle: vec![0; epochs],
            },
        };
        Exact {
            limit: s.limit,
            t0: s.t0,
            counts_denied: s.strict || s.limit.algorithm == Algorithm::FixedWindow,
            period_ms: period_ms(s),
            kind,
            stats: vec![WindowStats::default(); s.windows as usize],
        }
    }

    /// A hit at `t` (ms from the start), admitted or not by the fleet.
    pub fn record(&mut self, t: u64, admitted: bool) {
        let (limit, counts_denied, t0) = (self.limit, self.counts_denied, self.t0);
        let stats = &mut self.stats[(t / self.period_ms) as usize];
        stats.offered += 1;
        if admitted {
            stats.admitted += 1;
        }
        match &mut self.kind {
            Kind::Window { truth, oracle } => {
                window_record(
                    &limit,
                    counts_denied,
                    (truth, oracle),
                    stats,
                    (t0, t, admitted),
                );
            }
            Kind::Bucket {
                truth,
                oracle,
                alone,
            } => {
                if alone.take(t, true) {
                    stats.exact_admitted += 1;
                }
                // The fleet's admitted hits are taken whatever the level: an over-admission
                // owes tokens, as it would in the real bucket.
                if truth.take(t, false) && !admitted {
                    stats.denied_with_room += 1;
                }
                if admitted {
                    truth.spend();
                }
                let fits = oracle.take(t, true);
                if fits && !admitted {
                    stats.false_denials += 1;
                }
                if admitted && !fits {
                    oracle.spend();
                }
            }
        }
    }
}

/// The window reference's step: the sliding (or fixed) window count per epoch. When
/// `counts_denied` (a fixed window, or a `strict` sliding one) every hit counts, denied or
/// not, in the reference as in sluice; otherwise only admitted hits, and a false denial
/// enters the oracle as if admitted.
fn window_record(
    limit: &Limit,
    counts_denied: bool,
    (truth, oracle): (&mut [u64], &mut [u64]),
    stats: &mut WindowStats,
    (t0, t, admitted): (u64, u64, bool),
) {
    let now = t0 + t;
    let w = limit.window_ms;
    // The run starts on a window boundary, so window and epoch indices coincide.
    let e = (now / w - t0 / w) as usize;
    let prev = |v: &[u64]| if e == 0 { 0 } else { v[e - 1] };
    let true_count = exact_estimate(limit, now, truth[e], prev(truth));
    let oracle_count = exact_estimate(limit, now, oracle[e], prev(oracle));
    let rpu = u64::from(limit.requests_per_unit);
    if admitted || counts_denied {
        truth[e] += 1;
        oracle[e] += 1;
    }
    if !admitted {
        if true_count < rpu {
            stats.denied_with_room += 1;
        }
        if oracle_count < rpu {
            stats.false_denials += 1;
            if !counts_denied {
                oracle[e] += 1;
            }
        }
    }
}

/// The sliding (or fixed) window count at `t` (Unix ms) from the two epochs' counters, in
/// integer arithmetic: the exact reference, and what the plain design's reads return.
pub fn exact_estimate(limit: &Limit, t: u64, curr: u64, prev: u64) -> u64 {
    match limit.algorithm {
        Algorithm::FixedWindow | Algorithm::TokenBucket { .. } => curr,
        Algorithm::Concurrency => prev + curr,
        Algorithm::SlidingWindow => {
            let w = u128::from(limit.window_ms);
            let left = w - u128::from(t % limit.window_ms);
            (u128::from(prev) * left / w) as u64 + curr
        }
    }
}

/// A token bucket as the textbook states it, not as sluice keeps it (a GCRA time): a level
/// refilled continuously at the rate, capped at the burst, one token a hit, lenient (a hit
/// that does not fit takes nothing). In integer units of `1 / window_ms` token, so that a
/// refill of `rpu` tokens a window is `rpu` units a millisecond and nothing is rounded: one
/// token is `window_ms` units, and the arrivals fall on whole milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct ModelBucket {
    /// The level, in units; below 0 when the fleet admitted more than the bucket held.
    level: i128,
    cap: i128,
    token: i128,
    per_ms: i128,
    at_ms: u64,
}

impl ModelBucket {
    /// A full bucket of `burst` tokens refilling `rpu` per `window_ms`.
    pub fn full(rpu: u32, window_ms: u64, burst: u32) -> Self {
        let token = i128::from(window_ms.max(1));
        ModelBucket {
            level: i128::from(burst) * token,
            cap: i128::from(burst) * token,
            token,
            per_ms: i128::from(rpu),
            at_ms: 0,
        }
    }

    /// A hit at `t` (ms from the start): whether a token was there for it, taken when
    /// `take_it`.
    pub fn take(&mut self, t: u64, take_it: bool) -> bool {
        let refill = i128::from(t.saturating_sub(self.at_ms)) * self.per_ms;
        self.at_ms = self.at_ms.max(t);
        if self.level < self.cap {
            self.level = (self.level + refill).min(self.cap);
        }
        let fits = self.has_room();
        if fits && take_it {
            self.level -= self.token;
        }
        fits
    }

    /// Whether a token is there now (as of the last hit).
    fn has_room(&self) -> bool {
        self.per_ms > 0 && self.level >= self.token
    }

    /// Takes a token whatever the level: a hit the fleet admitted, owed when it did not fit.
    pub fn spend(&mut self) {
        self.level -= self.token;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_bucket_refills_at_the_rate_up_to_the_burst() {
        // 10 a second, burst 30.
        let mut b = ModelBucket::full(10, 1000, 30);
        assert_eq!((0..40).filter(|_| b.take(0, true)).count(), 30);
        assert!(!b.take(99, true));
        // A look takes nothing.
        assert!(b.take(100, false));
        assert!(b.take(100, true));
        assert!(!b.take(100, true));
        assert_eq!((0..40).filter(|_| b.take(1_100, true)).count(), 10);
        assert_eq!((0..40).filter(|_| b.take(100_000, true)).count(), 30);
        // A spend below empty is owed: the refill repays it first.
        let mut b = ModelBucket::full(10, 1000, 1);
        assert!(b.take(0, true));
        b.spend();
        assert!(!b.take(100, true));
        assert!(b.take(200, false));
        assert!(b.take(200, true));
        assert!(!b.take(200, true));
    }
}
