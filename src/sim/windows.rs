//! The window scenarios of `sluice simulate`: the shared setting (20 nodes, 1000 a minute,
//! a 1 s tick) and the named runs on it — cold surges, outages, restarts, the surge at the
//! edge, slow surges, bursts, a departure, and a fleet starting or growing as a surge begins. The token-bucket ones are in `buckets.rs`.

use super::{Departure, Load, Scenario, Start};
use crate::core::{Algorithm, Limit};

/// The window of every named window scenario.
const W: u64 = 60_000;

/// What the named scenarios share unless they say otherwise: 20 nodes, a limit of 1000 per
/// 60 s sliding window (the default algorithm), a 1 s tick (the production default), a 2 ms
/// round trip and 4 windows.
pub(super) fn base() -> Scenario {
    Scenario {
        name: "",
        nodes: 20,
        limit: Limit {
            requests_per_unit: 1000,
            window_ms: W,
            algorithm: Algorithm::SlidingWindow,
        },
        tick_ms: 1000,
        rtt_ms: 2,
        loads: vec![],
        outage: None,
        restart_at_ms: None,
        departure: None,
        windows: 4,
        seed: 0x5eed_0001,
        alternate: false,
        phases: None,
        strict: false,
        t0: super::T0,
        starts: None,
    }
}

/// A cold entity hit by `times` its limit within the first 100 ms (a within-one-tick burst).
pub(super) fn burst(times: f64, limit: &Limit) -> Load {
    even(0, 100, times * limit.window_ms as f64 / 100.0)
}

/// Traffic spread evenly over the nodes.
pub(super) fn even(from_ms: u64, until_ms: u64, times_limit: f64) -> Load {
    Load {
        from_ms,
        until_ms,
        times_limit,
        hot_share: None,
    }
}

/// The named window scenarios, on the shared setting (`base`) unless said otherwise.
pub fn scenarios(base: &Scenario) -> Vec<Scenario> {
    vec![
        // An entity nobody has seen, hit at 10× its limit from the start of a window.
        Scenario {
            name: "cold surge 10x",
            loads: vec![even(0, 4 * W, 10.0)],
            ..base.clone()
        },
        // Twice the limit, from cold into the steady state.
        Scenario {
            name: "steady 2x",
            loads: vec![even(0, 4 * W, 2.0)],
            seed: 0x5eed_0002,
            ..base.clone()
        },
        // Twice the limit, half of it on node 0 and the rest spread over the other 19.
        Scenario {
            name: "one hot node",
            loads: vec![Load {
                from_ms: 0,
                until_ms: 4 * W,
                times_limit: 2.0,
                hot_share: Some(0.5),
            }],
            seed: 0x5eed_0003,
            ..base.clone()
        },
        // 3× the limit from 15 s before the first boundary, with a 40 ms round trip so that
        // syncs are in flight across the boundaries that follow.
        Scenario {
            name: "epoch rollover",
            loads: vec![even(W - 15_000, 4 * W, 3.0)],
            rtt_ms: 40,
            seed: 0x5eed_0004,
            ..base.clone()
        },
        // Twice the limit; the store is down from 20 s to 50 s into the second window.
        Scenario {
            name: "redis outage",
            loads: vec![even(0, 4 * W, 2.0)],
            outage: Some((W + 20_000, W + 50_000)),
            seed: 0x5eed_0005,
            ..base.clone()
        },
        // Twice the limit over 4 replicas; the store goes down 28 s into the second window and
        // comes back 2 s later empty, as a Redis without persistence restarts.
        Scenario {
            name: "redis restart",
            nodes: 4,
            loads: vec![even(0, 4 * W, 2.0)],
            outage: Some((W + 28_000, W + 30_000)),
            restart_at_ms: Some(W + 30_000),
            seed: 0x5eed_0007,
            ..base.clone()
        },
        // Two replicas, a limit of 600 a minute, hit from cold by 1000 requests a second (100×
        // the limit) for 5 s: the small-fleet surge a real deployment sees, which the targets (ARCHITECTURE.md, "Targets")
        // wants within 1.10× like any other cold surge.
        Scenario {
            name: "2-replica surge",
            nodes: 2,
            limit: Limit {
                requests_per_unit: 600,
                ..base.limit
            },
            loads: vec![even(0, 5_000, 100.0)],
            windows: 1,
            seed: 0x5eed_0006,
            ..base.clone()
        },
    ]
    .into_iter()
    .chain(edge_surges(base))
    .chain(slow_surges(base))
    .chain(burst_and_departure(base))
    .chain(starts_and_joins(base))
    .collect()
}

/// The surge at the edge (issue 19): two replicas, a value nobody has seen on a rule of 600
/// an hour, hit by ten times that over 6 s by a client sending 1,000 requests a second in
/// turn to each replica; with the rule's default `strict` and with `strict: false`.
/// `tests/global.rs` runs it on two real processes and real Redis. An hour's window: no
/// boundary falls in the surge, and the epoch began long before it, as in production.
fn edge_surges(base: &Scenario) -> Vec<Scenario> {
    let limit = Limit {
        requests_per_unit: 600,
        window_ms: 3_600_000,
        algorithm: Algorithm::SlidingWindow,
    };
    let edge = Scenario {
        name: "edge surge, 2 nodes",
        nodes: 2,
        limit,
        loads: vec![even(0, 6_000, 1000.0 * 3_600.0 / 600.0)],
        windows: 1,
        // Tick phases where, before replicas denying a young entity sent their hits at once,
        // the race was open: 1.355× (`strict: false`) and 1.098× (`strict`) on this seed.
        seed: 0x5eed_0019,
        alternate: true,
        ..base.clone()
    };
    vec![
        Scenario {
            name: "edge surge, 2 nodes, strict",
            strict: true,
            ..edge.clone()
        },
        edge,
    ]
}

/// Slower surges at the edge: a value nobody has seen on a rule of 600 an hour, hit by ten
/// times that at a pace that reaches the limit one to two seconds in, after the replicas
/// settled (their first reply a tick old): two replicas at 400 requests a second in turn,
/// four at 300 a second spread at random. Settled replicas then share the room on reads
/// that miss what the others have not sent yet; before young replicas sent their hits at a
/// quarter of their prior and settled ones re-read as they spent their share, they
/// admitted up to 1.25× (two) and 1.2× (four) the limit, `strict` or not.
fn slow_surges(base: &Scenario) -> Vec<Scenario> {
    let limit = Limit {
        requests_per_unit: 600,
        window_ms: 3_600_000,
        algorithm: Algorithm::SlidingWindow,
    };
    let per_second = |n: f64| n * 3_600.0 / 600.0;
    vec![
        Scenario {
            name: "slow surge, 2 nodes",
            nodes: 2,
            limit,
            loads: vec![even(0, 15_000, per_second(400.0))],
            windows: 1,
            // 1.250× the limit on this seed before the fix.
            seed: 0x5eed_0020,
            alternate: true,
            ..base.clone()
        },
        Scenario {
            name: "slow surge, 4 nodes",
            nodes: 4,
            limit,
            loads: vec![even(0, 20_000, per_second(300.0))],
            windows: 1,
            // 1.2× the limit on this seed before the fix.
            seed: 0x5eed_0021,
            ..base.clone()
        },
    ]
}

/// The scenarios of a fleet's size: within-a-tick bursts and a departure.
fn burst_and_departure(base: &Scenario) -> Vec<Scenario> {
    vec![
        // Within-one-tick bursts on a cold entity: twice (2 and 4 replicas) or ten times (20
        // and 50) the limit arriving in 100 ms, before any tick could tell one replica what
        // the others admitted; the 2-replica one on the surge's limit of 600 a minute.
        Scenario {
            name: "burst 2x, 2 nodes",
            nodes: 2,
            limit: Limit {
                requests_per_unit: 600,
                ..base.limit
            },
            loads: vec![burst(2.0, &base.limit)],
            windows: 1,
            seed: 0x5eed_0007,
            ..base.clone()
        },
        Scenario {
            name: "burst 2x, 4 nodes",
            nodes: 4,
            loads: vec![burst(2.0, &base.limit)],
            windows: 1,
            seed: 0x5eed_0008,
            ..base.clone()
        },
        Scenario {
            name: "burst 10x, 20 nodes",
            loads: vec![burst(10.0, &base.limit)],
            windows: 1,
            seed: 0x5eed_0009,
            ..base.clone()
        },
        Scenario {
            name: "burst 10x, 50 nodes",
            nodes: 50,
            loads: vec![burst(10.0, &base.limit)],
            windows: 1,
            seed: 0x5eed_000a,
            ..base.clone()
        },
        // Four replicas at twice the limit; one stops cleanly 30 s into the second window and
        // its traffic goes to the other three.
        Scenario {
            name: "departure",
            nodes: 4,
            loads: vec![even(0, 3 * W, 2.0)],
            departure: Some(Departure {
                node: 3,
                at_ms: W + 30_000,
            }),
            windows: 3,
            seed: 0x5eed_000b,
            ..base.clone()
        },
    ]
}

/// The surge at the edge (two replicas at 1,000 requests a second on a rule of 600 an hour,
/// for 6 s) on a fleet that starts or grows as it begins: each replica starts as the service
/// does, and takes traffic once it reports ready (`Scenario::starts`). Before a replica
/// knew the fleet before it reported ready (`global/join.rs`), one that started first decided
/// as if alone until its next tick: 1.00–1.10× with up to 9 % false denials (eight seeds;
/// real processes, 1.11–1.27×), and a replica joining two running ones while the surge was
/// young, 1.00–1.11× with up to 10 %.
fn starts_and_joins(base: &Scenario) -> Vec<Scenario> {
    let edge = Scenario {
        nodes: 2,
        limit: Limit {
            requests_per_unit: 600,
            window_ms: 3_600_000,
            algorithm: Algorithm::SlidingWindow,
        },
        loads: vec![even(0, 6_000, 1000.0 * 3_600.0 / 600.0)],
        windows: 1,
        alternate: true,
        ..base.clone()
    };
    vec![
        // Two replicas started within a second of each other, the second 50 ms before the
        // surge.
        Scenario {
            name: "start together, 2 nodes",
            starts: Some(vec![
                Start {
                    at_ms: -1_050,
                    spread_ms: 1_000,
                },
                Start {
                    at_ms: -50,
                    spread_ms: 0,
                },
            ]),
            seed: 0x5eed_0022,
            ..edge.clone()
        },
        // Two replicas running, and a third starting within the surge's first 400 ms, while
        // the value is young on the others (its prior counts the replicas).
        Scenario {
            name: "join mid-surge, 3 nodes",
            nodes: 3,
            starts: Some(vec![
                Start {
                    at_ms: -2_000,
                    spread_ms: 1_000,
                },
                Start {
                    at_ms: -2_000,
                    spread_ms: 1_000,
                },
                Start {
                    at_ms: 0,
                    spread_ms: 400,
                },
            ]),
            seed: 0x5eed_0023,
            ..edge
        },
    ]
}
