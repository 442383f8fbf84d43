//! Property tests of the decision core on a manual clock, against a straightforward model:
//! a single node never admits more than the limit in a window and never denies a request the
//! model says fits, strict or not, with huge addends (saturating, never wrapping) and refunds
//! (never below zero, never adding); a concurrency limit holds what a model of the
//! acquisitions in flight holds. Plus exactness of the limiter under concurrent threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use sluice::core::clock::{ManualClock, UnixMillis};
use sluice::core::{decide, Algorithm, Count, Limit, LimitState, Verdict, WindowState, MAX_COUNT};

const W: u64 = 10_000;
const T0: u64 = 1_700_000_000_000;

/// The model: what each aligned window counted (every hit when strict, as the reference's
/// INCRBY; else only admitted ones; saturating at `MAX_COUNT`, refunds stopping at 0), and
/// what it admitted.
#[derive(Default)]
struct Model {
    per_window: std::collections::HashMap<u64, u64>,
    admitted: std::collections::HashMap<u64, u64>,
}

impl Model {
    /// The count the limit sees at `t` before new hits (exact rational arithmetic).
    fn estimate(&self, limit: &Limit, t: u64) -> u128 {
        let e = t / W;
        let curr = u128::from(self.per_window.get(&e).copied().unwrap_or(0));
        match limit.algorithm {
            Algorithm::FixedWindow | Algorithm::TokenBucket { .. } | Algorithm::Concurrency => curr,
            Algorithm::SlidingWindow => {
                let prev = if e == 0 {
                    0
                } else {
                    self.per_window.get(&(e - 1)).copied().unwrap_or(0)
                };
                u128::from(prev) * u128::from(W - t % W) / u128::from(W) + curr
            }
        }
    }

    fn count(&mut self, t: u64, hits: u64) {
        let c = self.per_window.entry(t / W).or_default();
        *c = c.saturating_add(hits).min(MAX_COUNT);
    }

    fn refund(&mut self, t: u64, hits: u64) {
        let c = self.per_window.entry(t / W).or_default();
        *c -= hits.min(*c);
    }
}

/// One request of `hits` on a rule of one limit through `core::decide`, in local mode.
fn hit(state: &mut WindowState, limit: &Limit, strict: bool, t: UnixMillis, hits: u64) -> Verdict {
    let mut states = [LimitState::Window(*state)];
    let count = Count::Yes { hold_within: false };
    let d = decide([(limit, strict)], &mut states, t, hits, count, None).unwrap();
    if let LimitState::Window(w) = states[0] {
        *state = w;
    }
    d.outcome.verdict
}

/// One step: (time step in ms, hits, a refund rather than a hit).
fn arb_steps() -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    let hits = prop_oneof![
        8 => 0u64..4,
        1 => (1u64 << 62)..u64::MAX,
        1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 100), Just(1u64 << 63)],
    ];
    prop::collection::vec((0..W, hits, prop::bool::weighted(0.1)), 1..300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn never_over_the_limit_in_a_window_never_denied_below(
        rpu in 0u32..20,
        fixed in any::<bool>(),
        strict in any::<bool>(),
        steps in arb_steps(),
    ) {
        let limit = Limit {
            requests_per_unit: rpu,
            window_ms: W,
            algorithm: if fixed { Algorithm::FixedWindow } else { Algorithm::SlidingWindow },
        };
        let mut state = WindowState::default();
        let mut model = Model::default();
        let mut t = T0;
        let mut refunded = false;
        for (dt, hits, refund) in steps {
            t += dt / 4;
            if refund {
                state.refund(&limit, UnixMillis(t), hits);
                model.refund(t, hits);
                refunded = true;
                prop_assert_eq!(
                    u128::from(state.current_count(&limit, UnixMillis(t))),
                    model.estimate(&Limit { algorithm: Algorithm::FixedWindow, ..limit }, t)
                );
                continue;
            }
            let expected_over =
                rpu == 0 || model.estimate(&limit, t) + u128::from(hits) > u128::from(rpu);
            let v = hit(&mut state, &limit, strict, UnixMillis(t), hits);
            prop_assert_eq!(v.over, expected_over, "at t={} hits={}", t, hits);
            if !v.over || strict {
                model.count(t, hits);
            }
            if v.over {
                prop_assert_eq!(v.remaining, 0);
            } else {
                *model.admitted.entry(t / W).or_default() += hits;
                prop_assert_eq!(
                    u128::from(v.remaining),
                    u128::from(rpu) - model.estimate(&limit, t)
                );
            }
            prop_assert!(v.reset_ms >= 1 && v.reset_ms <= W);
        }
        if !refunded {
            for (_, admitted) in model.admitted {
                prop_assert!(admitted <= u64::from(rpu));
            }
        }
    }
}

/// The model of a concurrency limit: every acquisition in flight with its time, oldest
/// first. One lapses when its window (of `W`) leaves the count, i.e. from the start of the
/// window after next; a release removes the oldest.
#[derive(Default)]
struct InFlight(std::collections::VecDeque<u64>);

impl InFlight {
    fn at(&mut self, t: u64) -> usize {
        while self.0.front().is_some_and(|&a| a / W + 2 <= t / W) {
            self.0.pop_front();
        }
        self.0.len()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn a_concurrency_limit_holds_what_is_in_flight_as_the_model_does(
        n in 0u32..6,
        steps in prop::collection::vec((0..W, 0u64..4, prop::bool::weighted(0.4)), 1..300),
    ) {
        let limit = Limit { requests_per_unit: n, window_ms: W, algorithm: Algorithm::Concurrency };
        let mut state = WindowState::default();
        let mut model = InFlight::default();
        let mut t = T0;
        for (dt, hits, release) in steps {
            t += dt / 3;
            let held = model.at(t);
            if release {
                state.refund(&limit, UnixMillis(t), hits);
                for _ in 0..hits.min(held as u64) {
                    model.0.pop_front();
                }
                continue;
            }
            let v = hit(&mut state, &limit, false, UnixMillis(t), hits);
            let fits = n != 0 && held as u64 + hits <= u64::from(n);
            prop_assert_eq!(v.over, !fits, "at t={} hits={} held={}", t, hits, held);
            if fits {
                model.0.extend(std::iter::repeat_n(t, hits as usize));
                prop_assert_eq!(u64::from(v.remaining), u64::from(n) - held as u64 - hits);
            }
            // Never more in flight than the limit, whatever came late.
            prop_assert!(model.at(t) <= n as usize);
        }
    }
}

#[test]
fn concurrent_threads_admit_exactly_the_limit() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use sluice::rls::{Options, RateLimiter};

    for algorithm in ["sliding_window", "fixed_window"] {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 500, algorithm: {algorithm}}}\n");
        let clock = ManualClock::new(UnixMillis(T0 - T0 % 60_000));
        let limiter = RateLimiter::local(&yaml, Arc::new(clock), Options::default()).unwrap();
        let admitted = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..16 {
                let (limiter, admitted) = (limiter.clone(), admitted.clone());
                s.spawn(move || {
                    let req = RateLimitRequest {
                        domain: "d".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "k".into(),
                                value: "v".into(),
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 0,
                    };
                    for _ in 0..100 {
                        if limiter.should_rate_limit(&req).unwrap().overall_code == 1 {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 500, "{algorithm}");
    }
}
