//! Criterion benchmarks of the hot path (ARCHITECTURE.md, "Targets"): `core::decide` (the
//! function the service calls per descriptor) on a rule of one limit with 1M tracked
//! entities (target ≤ 200 ns median), local and global (synced) states — on bare states, and
//! through the entity table (the lookup, the shard's lock and the decision, as a request
//! pays them) — and a whole `ShouldRateLimit` request through the limiter in local mode over
//! 10k and 1M distinct values.
//!
//! `cargo bench --bench decide` (add `-- --quick` for a short run).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::core::clock::{ManualClock, UnixMillis};
use sluice::core::table::{CacheSettings, EntityTable};
use sluice::core::{decide, Algorithm, Count, FleetView, Limit, LimitState, Verdict, WindowState};
use sluice::rls::{Options, RateLimiter};

const T0: u64 = 1_700_000_040_000;
const ENTITIES: usize = 1_000_000;

/// A cheap, deterministic index stream (an LCG), so the benchmark measures `decide`, not a PRNG.
fn next(x: &mut u64) -> usize {
    *x = x
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*x >> 33) as usize % ENTITIES
}

/// One request of one hit on a rule of `limit` (strict, counted) through `core::decide`, as
/// `rls/evaluate.rs` makes it: `fleet` is `None` in local mode, the fleet in global mode.
#[inline]
fn hit(s: &mut [LimitState], limit: &Limit, now: UnixMillis, fleet: Option<&FleetView>) -> Verdict {
    let count = Count::Yes { hold_within: false };
    match decide([(limit, true)], s, now, 1, count, fleet) {
        Some(d) => d.outcome.verdict,
        None => unreachable!("one limit"),
    }
}

fn bench_decide(c: &mut Criterion) {
    let limit = Limit {
        requests_per_unit: 1_000_000,
        window_ms: 60_000,
        algorithm: Algorithm::SlidingWindow,
    };
    let now = UnixMillis(T0 + 30_000);
    // 1k states stay in cache: the decision's own cost. 1M: what a busy table pays, mostly
    // the miss on the state.
    for n in [1_000, ENTITIES] {
        let mut local = vec![LimitState::Window(WindowState::default()); n];
        let mut x = 1;
        c.bench_function(&format!("decide: {} entities, local", label(n)), |b| {
            b.iter(|| {
                let i = next(&mut x) % n;
                hit(&mut local[i..=i], &limit, now, None)
            })
        });

        // Global mode: every state has synced twice, so the shared-headroom path runs.
        let mut global = vec![LimitState::Window(WindowState::default()); n];
        for s in global.chunks_mut(1) {
            for (k, t) in [T0 + 1_000, T0 + 2_000].into_iter().enumerate() {
                hit(s, &limit, UnixMillis(t), None);
                let s = &mut s[0];
                let plan = s.begin_sync(&limit, UnixMillis(t));
                let total = 10 * (k as u64 + 1);
                s.complete_sync(&limit, &plan, [total, 0], UnixMillis(t));
            }
        }
        // The floor: one word of a random state, with nothing waiting on it, so the misses
        // of successive calls overlap (docs/performance.md).
        c.bench_function(&format!("read: {} states, one word", label(n)), |b| {
            b.iter(|| global[next(&mut x) % n].ever_synced())
        });
        c.bench_function(&format!("decide: {} entities, global", label(n)), |b| {
            b.iter(|| {
                let i = next(&mut x) % n;
                hit(&mut global[i..=i], &limit, now, Some(&FleetView::ALONE))
            })
        });
    }
}

fn label(n: usize) -> String {
    if n >= 1_000_000 {
        format!("{}M", n / 1_000_000)
    } else {
        format!("{}k", n / 1_000)
    }
}

/// An entity key as the rules make them (XXH3-128): spread over the table's shards.
fn key(i: usize) -> u128 {
    xxhash_rust::xxh3::xxh3_128(&(i as u64).to_le_bytes())
}

/// A table of 1M entities of `limit`, each synced twice when `synced` (global mode).
fn table(limit: Limit, synced: bool) -> EntityTable {
    let t = EntityTable::new(CacheSettings::default());
    for i in 0..ENTITIES {
        t.with(
            key(i),
            UnixMillis(T0),
            || vec![limit],
            |e| {
                if synced {
                    for (n, at) in [T0 + 1_000, T0 + 2_000].into_iter().enumerate() {
                        hit(&mut e.state.states, &limit, UnixMillis(at), None);
                        let s: &mut LimitState = &mut e.state.states[0];
                        let plan = s.begin_sync(&limit, UnixMillis(at));
                        s.complete_sync(&limit, &plan, [10 * (n as u64 + 1), 0], UnixMillis(at));
                    }
                }
            },
        );
    }
    t
}

fn bench_table(c: &mut Criterion) {
    let window = Limit {
        requests_per_unit: 1_000_000,
        window_ms: 60_000,
        algorithm: Algorithm::SlidingWindow,
    };
    let bucket = Limit {
        requests_per_unit: 1_000_000,
        window_ms: 1_000,
        algorithm: Algorithm::TokenBucket { burst: 1_000_000 },
    };
    let now = UnixMillis(T0 + 30_000);
    for (name, limit, synced) in [
        ("local window", window, false),
        ("global window", window, true),
        ("local bucket", bucket, false),
    ] {
        let t = table(limit, synced);
        let fleet = synced.then_some(FleetView::ALONE);
        let mut x = 1;
        c.bench_function(&format!("table + decide: 1M entities, {name}"), |b| {
            b.iter(|| {
                t.with(
                    key(next(&mut x)),
                    now,
                    || vec![limit],
                    |e| hit(&mut e.state.states, &limit, now, fleet.as_ref()),
                )
            })
        });
    }
}

fn limiter(values: usize) -> (Arc<RateLimiter>, Vec<RateLimitRequest>) {
    let yaml = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n";
    let clock = ManualClock::new(UnixMillis(T0));
    let limiter = RateLimiter::local(yaml, Arc::new(clock), Options::default()).unwrap();
    let requests: Vec<RateLimitRequest> = (0..values)
        .map(|v| RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: format!("u{v}"),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .collect();
    // Warm the entity table, as a running service's is.
    for r in &requests {
        limiter.should_rate_limit(r).unwrap();
    }
    (limiter, requests)
}

fn bench_request(c: &mut Criterion) {
    for values in [10_000, ENTITIES] {
        let (limiter, requests) = limiter(values);
        let mut i = 0;
        c.bench_function(
            &format!("should_rate_limit: 1 descriptor, {values} values, local"),
            |b| {
                b.iter(|| {
                    i = (i + 7919) % requests.len();
                    limiter.should_rate_limit(&requests[i]).unwrap()
                })
            },
        );
    }
}

criterion_group!(benches, bench_decide, bench_table, bench_request);
criterion_main!(benches);
