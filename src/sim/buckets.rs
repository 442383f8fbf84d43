//! The token-bucket scenarios: the sizes an Envoy or Istio edge puts on its users (a
//! per-IP bucket of 100 a second, bursts of 200; a per-user one of 10 a second, bursts of
//! 30; a per-user page-load bucket of 5 a second, bursts of 30), and the traffic that tests
//! them — a cold burst, a steady 2×, bursts of a human's page loads.
//!
//! Each is reported per period of [`super::period_ms`] against an exact bucket fed the
//! same arrivals (`exact.rs`): sluice's admitted hits over the exact bucket's, and the false
//! denials over the same.

use super::traffic::SplitMix64;
use super::{even, period_ms, Load, Scenario};
use crate::core::{Algorithm, Limit};

/// `rate` tokens a second, bursts of `burst`.
fn bucket(rate: u32, burst: u32) -> Limit {
    Limit {
        requests_per_unit: rate,
        window_ms: 1000,
        algorithm: Algorithm::TokenBucket { burst },
    }
}

/// `hits` hits spread evenly over `from_ms..until_ms` on a bucket of `rate` a second.
fn hits(from_ms: u64, until_ms: u64, hits: u64, rate: u32) -> Load {
    let secs = until_ms.saturating_sub(from_ms).max(1) as f64 / 1000.0;
    // Half a hit more, so that the floor `traffic::arrivals` takes is `hits` exactly.
    even(from_ms, until_ms, (hits as f64 + 0.5) / secs / f64::from(rate))
}

/// The bucket scenarios, on the window scenarios' setting (`base`: its tick and round trip).
pub fn scenarios(base: &Scenario) -> Vec<Scenario> {
    let per_ip = bucket(100, 200);
    let per_user = bucket(10, 30);
    let pages = bucket(5, 30);
    let mut out = vec![
        // A value nobody has seen (a new client IP), hit by 5× its burst within 100 ms
        // across 20 replicas: before any tick, each replica knows only its own hits.
        Scenario {
            name: "bucket cold burst, 20 nodes",
            limit: per_ip,
            loads: vec![hits(0, 100, 1_000, per_ip.requests_per_unit)],
            windows: 1,
            seed: 0x5eed_0101,
            ..base.clone()
        },
        // The same across 4 replicas. (On a user's bucket of 30, 2 % of the exact bucket's
        // admitted hits is less than one: one false denial would miss it.)
        Scenario {
            name: "bucket cold burst, 4 nodes",
            nodes: 4,
            limit: per_ip,
            loads: vec![hits(0, 100, 1_000, per_ip.requests_per_unit)],
            windows: 1,
            seed: 0x5eed_0102,
            ..base.clone()
        },
        // Twice the refill rate for a minute across 20 replicas, from cold: the burst goes
        // in the first seconds, then the fleet must keep to the refill. Three periods of 20 s.
        Scenario {
            name: "bucket steady 2x, 20 nodes",
            limit: per_ip,
            loads: vec![even(0, 60_000, 2.0)],
            windows: 3,
            seed: 0x5eed_0103,
            ..base.clone()
        },
        // A user's bucket at twice its rate across 4 replicas: two periods of 30 s.
        Scenario {
            name: "bucket steady 2x, 4 nodes",
            nodes: 4,
            limit: per_user,
            loads: vec![even(0, 60_000, 2.0)],
            windows: 2,
            seed: 0x5eed_0104,
            ..base.clone()
        },
        // A human's page loads: bursts of 10–30 requests within half a second to a second,
        // pauses of 2–5 s, about the refill rate on average, spread over the replicas; three
        // periods of 60 s.
        Scenario {
            name: "bucket bursty human, 4 nodes",
            nodes: 4,
            limit: pages,
            windows: 3,
            seed: 0x5eed_0105,
            ..base.clone()
        },
        Scenario {
            name: "bucket bursty human, 20 nodes",
            limit: pages,
            windows: 3,
            seed: 0x5eed_0106,
            ..base.clone()
        },
    ];
    out.iter_mut().for_each(redraw);
    out
}

/// Draws a bursty-human scenario's bursts from its seed (the other scenarios' traffic does
/// not depend on it).
pub fn redraw(s: &mut Scenario) {
    if s.name.starts_with("bucket bursty human") {
        s.loads = human(s.seed, s.windows * period_ms(s), s.limit.requests_per_unit);
    }
}

/// Bursts of 10–30 hits, each spread over 500–1000 ms, with 2–5 s between the end of one
/// and the start of the next, until `until_ms`: on average 20 hits every 4.25 s, 4.7 a
/// second.
fn human(seed: u64, until_ms: u64, rate: u32) -> Vec<Load> {
    let mut rng = SplitMix64(seed ^ 0x6875_6d61_6e);
    let mut between = |lo: u64, hi: u64| lo + rng.next() % (hi - lo + 1);
    let mut out = Vec::new();
    let mut t = 0;
    while t < until_ms {
        let size = between(10, 30);
        let spread = between(500, 1000);
        out.push(hits(t, t + spread, size, rate));
        t += spread + between(2_000, 5_000);
    }
    out
}
