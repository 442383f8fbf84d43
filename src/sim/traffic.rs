//! The scenarios' seeded randomness: the hits' arrival times and nodes, the nodes' tick
//! phases, and when they start in the scenarios of a fleet that starts or grows. A
//! splitmix64 of our own, so the numbers are the same on every machine and in every version
//! of every crate.

use super::Scenario;

/// splitmix64: a tiny, well-mixed, seeded generator.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Every hit of the run as (ms from the start, node), in time order. Hits of a load are evenly
/// spaced in time; each goes to a node drawn by the seeded generator.
pub fn arrivals(s: &Scenario) -> Vec<(u64, usize)> {
    let mut rng = SplitMix64(s.seed);
    let mut out = Vec::new();
    if s.nodes == 0 {
        return out;
    }
    for load in &s.loads {
        let per_ms =
            load.times_limit * f64::from(s.limit.requests_per_unit) / s.limit.window_ms as f64;
        if per_ms <= 0.0 {
            continue;
        }
        let span = load.until_ms.saturating_sub(load.from_ms) as f64;
        let count = (span * per_ms) as u64;
        for k in 0..count {
            let t = load.from_ms + (k as f64 / per_ms) as u64;
            let node = match load.hot_share {
                _ if s.alternate => (k % s.nodes as u64) as usize,
                Some(share) if s.nodes > 1 => {
                    if rng.unit() < share {
                        0
                    } else {
                        1 + (rng.next() % (s.nodes as u64 - 1)) as usize
                    }
                }
                _ => (rng.next() % s.nodes as u64) as usize,
            };
            let node = match s.departure {
                // The departed node's hits go to one of the others, drawn evenly.
                Some(d) if t >= d.at_ms && node == d.node && s.nodes > 1 => {
                    (d.node + 1 + (rng.next() % (s.nodes as u64 - 1)) as usize) % s.nodes
                }
                _ => node,
            };
            out.push((t, node));
        }
    }
    out.sort_by_key(|&(t, _)| t);
    out
}

/// Each node's start (ms from the start of the traffic) when the scenario has starts
/// (`Scenario::starts`): `at_ms` plus a seeded part of `spread_ms`.
pub fn starts(s: &Scenario) -> Option<Vec<i64>> {
    let mut rng = SplitMix64(s.seed ^ 0x0073_7461_7274);
    let starts = s.starts.as_ref()?;
    Some(
        starts
            .iter()
            .map(|st| st.at_ms + (rng.next() % (st.spread_ms + 1)) as i64)
            .collect(),
    )
}

/// Each node's tick phase in [0, tick): real replicas start at unrelated moments, so their
/// sync ticks fall at unrelated points of the traffic.
pub fn phases(s: &Scenario) -> Vec<u64> {
    if let Some(p) = &s.phases {
        return p.iter().map(|&p| p % s.tick_ms.max(1)).collect();
    }
    let mut rng = SplitMix64(s.seed ^ 0x7469_636b);
    (0..s.nodes)
        .map(|_| rng.next() % s.tick_ms.max(1))
        .collect()
}
