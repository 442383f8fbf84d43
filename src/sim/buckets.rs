//! The token-bucket scenarios: the sizes an Envoy or Istio edge puts on its users (a
//! per-IP bucket of 100 a second, bursts of 200; a per-user one of 10 a second, bursts of
//! 30; a per-user page-load bucket of 5 a second, bursts of 30), and the traffic that tests
//! them — a cold burst, a steady 2×, bursts of a human's page loads.
//!
//! Each is reported per period of [`super::period_ms`] against an exact bucket fed the
//! same arrivals (`exact.rs`): sluice's admitted hits over the exact bucket's, and the false
//! denials over the same.

use super::traffic::SplitMix64;
use super::windows::even;
use super::{period_ms, Load, Scenario};
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
    even(
        from_ms,
        until_ms,
        (hits as f64 + 0.5) / secs / f64::from(rate),
    )
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
        // A warm fleet flooded everywhere at once: half the refill rate for a period (the
        // bucket stays full, every replica settled on its measured share), then 5× the
        // burst within 100 ms across every replica, and nothing after. No read comes between
        // the flood's hits but burst reads: whatever the replicas admit above the room in
        // those 100 ms is over-admission the period keeps.
        Scenario {
            name: "bucket warm flood, 20 nodes",
            limit: per_ip,
            loads: warm_flood(per_ip.requests_per_unit),
            windows: 2,
            seed: 0x5eed_0107,
            ..base.clone()
        },
        Scenario {
            name: "bucket warm flood, 4 nodes",
            nodes: 4,
            limit: per_ip,
            loads: warm_flood(per_ip.requests_per_unit),
            windows: 2,
            seed: 0x5eed_0108,
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

/// Half the refill rate for 20 s (one period of a bucket of 100 a second, bursts of 200),
/// then 1,000 hits within 100 ms at the start of the next period.
fn warm_flood(rate: u32) -> Vec<Load> {
    vec![even(0, 20_000, 0.5), hits(20_000, 20_100, 1_000, rate)]
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
    let mut rng = SplitMix64(seed ^ 0x0068_756d_616e);
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

#[cfg(test)]
mod tests {
    use super::super::{render_table, run, scenarios};

    fn named(name: &str) -> super::Scenario {
        scenarios().into_iter().find(|s| s.name == name).unwrap()
    }

    #[test]
    fn one_node_is_exact_for_a_bucket() {
        // Global mode alone: every sync spends this node's tokens in the store from when they
        // were spent, so its decisions are the exact bucket's, hit for hit.
        for name in ["bucket steady 2x, 4 nodes", "bucket bursty human, 4 nodes"] {
            let mut s = named(name);
            s.nodes = 1;
            s.windows = 1;
            let r = run(&s);
            for p in &r.sluice {
                assert_eq!(p.admitted, p.exact_admitted, "{name}: {p:?}");
                assert_eq!(
                    (p.false_denials, p.denied_with_room),
                    (0, 0),
                    "{name}: {p:?}"
                );
            }
        }
    }

    #[test]
    fn a_bucket_scenario_is_reported_against_the_exact_bucket() {
        let r = run(&named("bucket cold burst, 4 nodes"));
        assert_eq!(
            (r.burst, r.period_ms, r.sluice.len()),
            (Some(200), 20_000, 1)
        );
        assert!(r.baseline.is_empty(), "the plain design is a window's");
        let p = r.sluice[0];
        // 1,000 hits in 100 ms: the exact bucket admits its 200 and the 9 the refill brings
        // by the last, at 99 ms.
        assert_eq!((p.offered, p.exact_admitted), (1_000, 209));
        assert_eq!(r.sluice_admitted(0), p.admitted as f64 / 209.0);
        let table = render_table(&[r]);
        assert_eq!(table.lines().count(), 2 + 1, "{table}");
        assert!(
            table.contains("| bucket cold burst, 4 nodes | 100, 200 | 0–20 | 1000 | 209 |"),
            "{table}"
        );
    }

    #[test]
    fn the_human_bursts_are_redrawn_with_the_seed() {
        let s = named("bucket bursty human, 4 nodes");
        let other = s.reseeded(s.seed + 1);
        assert_ne!(s.loads, other.loads);
        assert_eq!(other, other.reseeded(other.seed));
        // About the refill rate: 5 a second over three minutes.
        let hits: f64 = other
            .loads
            .iter()
            .map(|l| (l.until_ms - l.from_ms) as f64 * l.times_limit * 5.0 / 1000.0)
            .sum();
        assert!((600.0..1_100.0).contains(&hits), "{hits}");
    }
}
