//! The fleet simulator behind `sluice simulate`: replicas sharing one limit through a store,
//! sluice's production code side by side with the plain design (ARCHITECTURE.md, "The plain design"), on simulated time.
//!
//! This file owns the scenario type, the traffic driver and the report; the window scenarios
//! are in `windows.rs`, the token-bucket ones in `buckets.rs`. The quota service's (RLQS)
//! scenarios, `sluice simulate --rlqs`, are in `rlqs.rs` (the run, over the same fleet),
//! `envoy.rs` (the simulated Envoy filter) and `rlqs_table.rs` (the scenarios, the table).
//! Each replica of sluice is the shipped code (`fleet.rs`): the `RateLimiter` request path in
//! global mode and its real `ShardSync` task (tick, tier cadence, backoff), started by
//! `global::spawn` as the service starts it, against an
//! in-memory store with a round trip and an optional outage (`store.rs`). Only two things are
//! models: the plain design (`plain.rs`), which is not our code, and the exact references
//! (`exact.rs`), which are the yardstick. So the table describes the system we ship.
//!
//! Each design runs on its own tokio current-thread runtime with paused time: every node's
//! clock is a fixed Unix start (`T0`, aligned to every window) plus tokio's elapsed time,
//! so the decisions and the sync tasks see the same simulated time, with no wall clock and no
//! threads. The fleet comes up two ticks before the traffic and each node's sync task starts
//! after a seeded phase, so a node's ticks fall at its own phase within each tick of the
//! traffic, as those of replicas already running do, and every node's heartbeats have
//! counted the whole fleet when the traffic starts: a fleet already running, which joined
//! long before. The scenarios of a fleet that starts or grows during the run
//! (`Scenario::starts`) start each replica at its moment instead, joining the fleet as the
//! service does (`global/join.rs`), and the traffic goes only to the replicas that report
//! ready, as a load balancer sends it. A driver task sleeps until each seeded arrival and
//! hands it to its node. A scenario therefore gives the same table on every
//! machine, which is what lets `tests/in_process/simulate.rs` assert its bounds.
//!
//! # What is measured
//! Per aligned window: the hits the fleet admitted, over the limit, and *false denials*: hits
//! denied although the exact algorithm (the window formula over the fleet's true admitted
//! hits) would have let them in — the count it sees plus the hits fit the limit. A false
//! denial enters the exact model's count as if admitted, so a free slot refused to ten
//! requests in a row counts once — the one hit the fleet failed to admit — not ten times;
//! [`WindowStats::denied_with_room`] keeps the raw per-request figure.
//!
//! A token bucket (`buckets.rs`) is measured per period of ten fill times ([`period_ms`])
//! against an exact bucket of our own (`exact.rs`) fed the same arrivals: the ratio is the
//! fleet's admitted hits over the exact bucket's, and false denials (hits denied while the
//! exact bucket, fed the fleet's admitted hits and the false denials before, held a token)
//! are a share of the exact bucket's admitted hits. The plain design is a window's: there is
//! no plain bucket to run beside it, and its column is left out.

mod buckets;
mod envoy;
mod exact;
mod fleet;
mod plain;
pub mod rlqs;
pub mod rlqs_matrix;
mod rlqs_table;
mod store;
mod table;
mod traffic;
mod windows;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use crate::core::clock::UnixMillis;
use crate::core::{Algorithm, Limit};
use exact::Exact;
use fleet::{Fleet, SimClock};
use plain::PlainFleet;
pub use rlqs_table::{idle_and_join, render_rlqs, rlqs_scenarios, run_rlqs, scenarios_at};
use store::SimStore;
pub use table::{render_table, run_all};

/// A Unix time aligned to every window of a minute or less, where the simulations start.
const T0: u64 = 1_700_000_040_000;

/// The start of a run on a limit of `window_ms`: [`T0`], moved back to the window's
/// boundary (windows are aligned to the Unix epoch, and a per-hour run's periods must be
/// its epochs).
pub fn aligned_t0(window_ms: u64) -> u64 {
    T0 - T0 % window_ms.max(1)
}

/// Traffic during one stretch of the run: hits evenly spaced in time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// When it starts, in ms from the start of the run.
    pub from_ms: u64,
    /// When it ends (exclusive), in ms from the start of the run.
    pub until_ms: u64,
    /// Offered hits per window, as a multiple of the limit (10.0: ten times the limit).
    pub times_limit: f64,
    /// Node 0's share of the hits, the rest going evenly to the others; `None`: every hit
    /// goes to a node drawn evenly from all of them.
    pub hot_share: Option<f64>,
}

/// A replica that stops cleanly (as at SIGTERM: final flush, heartbeat removed) at `at_ms`
/// from the start of the run; from then on its share of the traffic goes to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departure {
    /// Which replica.
    pub node: usize,
    /// When, in ms from the start of the run.
    pub at_ms: u64,
}

/// One simulated situation: a fleet, a limit, traffic, and how the store behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Short name, shown in the table.
    pub name: &'static str,
    /// Replicas in the fleet.
    pub nodes: usize,
    /// The limit every node enforces for the one simulated entity.
    pub limit: Limit,
    /// The sync task's tick. Each node ticks at its own seeded phase, as real replicas do.
    pub tick_ms: u64,
    /// Round-trip time to the store: a call is applied after half of it, answered after all.
    pub rtt_ms: u64,
    /// The traffic.
    pub loads: Vec<Load>,
    /// When the store is down (ms from the start, half-open): calls reaching it then fail.
    pub outage: Option<(u64, u64)>,
    /// When the store restarts empty (ms from the start): every counter is lost then.
    pub restart_at_ms: Option<u64>,
    /// A replica that stops cleanly during the run.
    pub departure: Option<Departure>,
    /// How many windows are run and reported (a bucket's: periods of [`period_ms`]);
    /// the run starts at a window boundary.
    pub windows: u64,
    /// Seed of the traffic and of the tick phases.
    pub seed: u64,
    /// Whether the hits go to the nodes in turn (a client alternating between replicas), not
    /// each to a node drawn at random.
    pub alternate: bool,
    /// Each node's tick phase (ms within a tick, from the start of the traffic); `None`:
    /// drawn from the seed. A test on real processes sets the phases it measured.
    pub phases: Option<Vec<u64>>,
    /// Whether a sliding window is `strict` (the default of a rule: denied hits count too),
    /// or `strict: false` (see `fleet::rules_yaml`).
    pub strict: bool,
    /// The Unix time (ms) the run starts at: on a boundary of the limit's window, so that
    /// the measured windows are the limit's epochs ([`T0`] for the scenarios up to a minute;
    /// see [`aligned_t0`]).
    pub t0: u64,
    /// When each replica starts, for a fleet that starts or grows during the run; `None`:
    /// the fleet is up and ready two ticks before the traffic (its sync tasks after their
    /// `phases`). With starts, each replica starts as the service does, and a hit goes only
    /// to a replica that reports ready, as a load balancer sends it: those addressed to a
    /// replica not ready yet are spread over the ones that are, and with none ready a hit is
    /// not offered at all (the client finds no endpoint).
    pub starts: Option<Vec<Start>>,
}

/// When a replica of a fleet that starts or grows during the run starts (`Scenario::starts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// The earliest moment, in ms from the start of the traffic (negative: before it, at
    /// most two ticks before).
    pub at_ms: i64,
    /// The start falls at a moment drawn from the seed within this many ms after `at_ms`.
    pub spread_ms: u64,
}

impl Scenario {
    /// The same scenario on another seed: the arrivals' nodes and the tick phases, and for
    /// the bursty-human buckets the bursts themselves, drawn anew.
    pub fn reseeded(&self, seed: u64) -> Scenario {
        let mut s = Scenario {
            seed,
            ..self.clone()
        };
        buckets::redraw(&mut s);
        s
    }
}

/// What one window looked like for one design.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Hits offered to the fleet in the window.
    pub offered: u64,
    /// Hits the fleet admitted in the window.
    pub admitted: u64,
    /// Hits denied that the exact algorithm would have admitted, each free slot once.
    pub false_denials: u64,
    /// Hits denied while the fleet's true count left room for them, per request.
    pub denied_with_room: u64,
    /// Token buckets only: hits an exact bucket fed every arrival of the period admits (0
    /// for a window, whose reference is its limit).
    pub exact_admitted: u64,
}

/// The outcome of one scenario: window by window, sluice and the plain design.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The scenario's name.
    pub scenario: &'static str,
    /// The limit per window (a bucket's refill per window).
    pub limit: u32,
    /// A token bucket's capacity; `None` for a window.
    pub burst: Option<u32>,
    /// The reported period (ms): the window, or a bucket's [`period_ms`].
    pub period_ms: u64,
    /// sluice, window by window (a bucket's: period by period, [`period_ms`]).
    pub sluice: Vec<WindowStats>,
    /// The plain design (decay of the last read + tier cadence), window by window; empty
    /// for a bucket (the plain design is a window's: there is nothing of it to run).
    pub baseline: Vec<WindowStats>,
    /// Store round trips sluice made (all nodes, whole run).
    pub sluice_round_trips: u64,
    /// Store round trips the plain design made.
    pub baseline_round_trips: u64,
}

impl Report {
    /// sluice's admitted hits in window `i` (0-based), over the reference ([`Report::reference`]).
    pub fn sluice_admitted(&self, i: usize) -> f64 {
        self.share(i, self.sluice[i].admitted)
    }

    /// The plain design's admitted hits in window `i`, over the limit.
    pub fn baseline_admitted(&self, i: usize) -> f64 {
        self.share(i, self.baseline[i].admitted)
    }

    /// sluice's false denials in window `i`, over the reference.
    pub fn sluice_false_denials(&self, i: usize) -> f64 {
        self.share(i, self.sluice[i].false_denials)
    }

    /// The plain design's false denials in window `i`, over the limit.
    pub fn baseline_false_denials(&self, i: usize) -> f64 {
        self.share(i, self.baseline[i].false_denials)
    }

    /// What window (or period) `i`'s figures are measured against: a window's limit, or the
    /// hits the exact bucket admitted in the period on the same arrivals (at least 1).
    pub fn reference(&self, i: usize) -> u64 {
        match self.burst {
            None => u64::from(self.limit.max(1)),
            Some(_) => self.sluice[i].exact_admitted.max(1),
        }
    }

    fn share(&self, i: usize, hits: u64) -> f64 {
        hits as f64 / self.reference(i) as f64
    }
}

/// The least length of a bucket scenario's reported period (see [`period_ms`]).
pub const BUCKET_PERIOD_MS: u64 = 10_000;

/// The reported period of `s`: its limit's window; for a bucket, ten times the time its
/// bucket takes to fill, in whole seconds, at least [`BUCKET_PERIOD_MS`]. A bucket has no
/// window of its own, and over less than a few fill times a ratio of admitted hits measures
/// one burst's rounding, not the rate: on a refill window of a second, 11 admitted for 10
/// is 1.10×, and one false denial of a 30-token burst is 3 %. Ten fill times: 20 s for 100
/// a second with bursts of 200, 60 s for 5 a second with bursts of 30. A run is `s.windows`
/// of them.
pub fn period_ms(s: &Scenario) -> u64 {
    match s.limit.algorithm {
        Algorithm::TokenBucket { burst } => {
            let rate = u64::from(s.limit.requests_per_unit.max(1));
            let fill_ms = u64::from(burst) * s.limit.window_ms / rate;
            (10 * fill_ms)
                .div_ceil(1000)
                .saturating_mul(1000)
                .max(BUCKET_PERIOD_MS)
        }
        _ => s.limit.window_ms,
    }
}

/// The named scenarios, on the shared setting (`windows::base`) unless said otherwise: the
/// window scenarios, then the token buckets'.
pub fn scenarios() -> Vec<Scenario> {
    let base = windows::base();
    windows::scenarios(&base)
        .into_iter()
        .chain(buckets::scenarios(&base))
        .collect()
}

/// Runs one scenario, for sluice and for the plain design, on the same traffic.
///
/// # Panics
/// When called inside a tokio runtime (each design runs on a runtime of its own), or when the
/// scenario's limit makes no rules file (a window that is not whole seconds).
pub fn run(scenario: &Scenario) -> Report {
    let s = scenario;
    let arrivals = traffic::arrivals(s);
    let phases = &traffic::phases(s);
    let starts = &traffic::starts(s);
    let (sluice, sluice_round_trips) = simulate(s, &arrivals, |clock, store| async move {
        match starts {
            Some(at) => Fleet::start_at(&s.limit, s.strict, s.tick_ms, clock, &store, at),
            None => Fleet::start(&s.limit, s.strict, s.tick_ms, clock, &store, phases).await,
        }
    });
    let burst = match s.limit.algorithm {
        Algorithm::TokenBucket { burst } => Some(burst),
        _ => None,
    };
    let (baseline, baseline_round_trips) = match burst {
        // The plain design is a window's (a decayed count); it has no bucket to run.
        Some(_) => (vec![], 0),
        None => simulate(s, &arrivals, |clock, store| async move {
            match starts {
                Some(at) => PlainFleet::start_at(&s.limit, s.tick_ms, clock, &store, at),
                None => PlainFleet::start(&s.limit, s.tick_ms, clock, &store, phases),
            }
        }),
    };
    Report {
        scenario: s.name,
        limit: s.limit.requests_per_unit,
        burst,
        period_ms: period_ms(s),
        sluice,
        baseline,
        sluice_round_trips,
        baseline_round_trips,
    }
}

/// A fleet under simulation, as the driver sees it.
trait Replicas {
    /// Node `node` answers one hit: whether it is admitted.
    fn hit(&self, node: usize) -> bool;
    /// Node `node` stops cleanly.
    fn stop(&self, node: usize);
    /// Whether node `node` takes traffic (it started and reports ready).
    fn ready(&self, node: usize) -> bool;
}

impl Replicas for Fleet {
    fn hit(&self, node: usize) -> bool {
        Fleet::hit(self, node)
    }
    fn ready(&self, node: usize) -> bool {
        Fleet::ready(self, node)
    }
    fn stop(&self, node: usize) {
        Fleet::stop(self, node);
    }
}

impl Replicas for PlainFleet {
    fn hit(&self, node: usize) -> bool {
        PlainFleet::hit(self, node)
    }
    /// The plain design has nothing to announce: the node just gets no more traffic.
    fn stop(&self, _: usize) {}
    fn ready(&self, node: usize) -> bool {
        PlainFleet::ready(self, node)
    }
}

/// Where a load balancer sends a hit addressed to `node`: there, if it is ready; else evenly
/// over the replicas that are (in turn when the scenario alternates, `turn` counting the
/// hits that went elsewhere); `None` when none is ready. A fleet that started before the
/// traffic is always ready, and every hit goes where it was addressed.
fn route<R: Replicas>(s: &Scenario, fleet: &R, node: usize, turn: &mut usize) -> Option<usize> {
    if fleet.ready(node) {
        return Some(node);
    }
    let ready: Vec<usize> = (0..s.nodes).filter(|&k| fleet.ready(k)).collect();
    if ready.is_empty() {
        return None;
    }
    *turn += 1;
    // The hits addressed to the replicas not ready, spread over those that are: in turn
    // they alternate, and at random the addressed replica's index is as random as the draw.
    let pick = if s.alternate { *turn } else { node + *turn };
    Some(ready[pick % ready.len()])
}

/// Runs one design over the scenario's arrivals on a fresh paused-time runtime: `start`
/// brings up its fleet on the clock and store given. Returns the per-window stats and the
/// store round trips made before the last window ended.
fn simulate<R, S, F>(s: &Scenario, arrivals: &[(u64, usize)], start: S) -> (Vec<WindowStats>, u64)
where
    R: Replicas,
    S: FnOnce(SimClock, Arc<SimStore>) -> F,
    F: std::future::Future<Output = R>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(async {
        let zero = Instant::now() + Duration::from_millis(2 * s.tick_ms);
        let clock = SimClock {
            t0: UnixMillis(s.t0),
            zero,
        };
        let store = Arc::new(SimStore::new(s.rtt_ms, s.outage, s.restart_at_ms, zero));
        let fleet = start(clock, store.clone()).await;
        let end = s.windows * period_ms(s);
        let mut exact = Exact::new(s);
        let mut departure = s.departure;
        let mut turn = 0;
        for &(t, node) in arrivals.iter().take_while(|&&(t, _)| t < end) {
            if let Some(d) = departure.filter(|d| d.at_ms <= t) {
                sleep_until(zero + Duration::from_millis(d.at_ms)).await;
                fleet.stop(d.node);
                departure = None;
            }
            let at = zero + Duration::from_millis(t);
            if Instant::now() < at {
                sleep_until(at).await;
            }
            let Some(node) = route(s, &fleet, node, &mut turn) else {
                continue;
            };
            let admitted = fleet.hit(node);
            exact.record(t, admitted);
        }
        sleep_until(zero + Duration::from_millis(end)).await;
        (exact.stats, store.round_trips())
    })
    // Dropping the runtime drops the sync tasks: nothing after the last window is measured.
}

#[cfg(test)]
mod tests {
    use super::fleet::rules_yaml;
    use super::*;

    #[test]
    fn the_same_scenario_gives_the_same_report() {
        let mut s = scenarios().remove(1);
        s.windows = 2;
        assert_eq!(run(&s), run(&s));
    }

    #[test]
    fn one_node_is_exact() {
        let mut s = scenarios().remove(1);
        s.nodes = 1;
        s.windows = 3;
        let r = run(&s);
        for w in &r.sluice {
            assert!(w.admitted <= 1000, "{w:?}");
            assert_eq!(w.false_denials, 0, "{w:?}");
        }
    }

    #[test]
    fn the_table_has_a_row_per_window() {
        let mut s = scenarios().remove(0);
        s.windows = 2;
        let table = render_table(&[run(&s)]);
        assert_eq!(table.lines().count(), 2 + 2);
        assert!(table.contains("| cold surge 10x | 1 | 10.00 |"), "{table}");
    }

    #[test]
    fn the_rules_file_says_the_scenario_limit() {
        for (window_ms, text) in [
            (60_000, "unit: minute, unit_multiplier: 1,"),
            (90_000, "unit: second, unit_multiplier: 90,"),
            (86_400_000, "unit: day, unit_multiplier: 1,"),
        ] {
            let limit = Limit {
                requests_per_unit: 7,
                window_ms,
                algorithm: Algorithm::FixedWindow,
            };
            let yaml = rules_yaml(&limit, false);
            assert!(yaml.contains(text), "{yaml}");
            let rules = crate::rules::compile_sources(&[("r.yaml".into(), yaml)], false);
            assert_eq!(rules.unwrap().rules()[0].limits[0].limit, limit);
        }
    }

    #[test]
    fn the_nodes_sync_through_the_store() {
        let mut s = scenarios().remove(4);
        s.windows = 2;
        let r = run(&s);
        // The nodes sync: at least the cold ticks of each node, and at most one round trip
        // per tick (sync and heartbeat) plus one early trip between two ticks, per node. The
        // fleet comes up two ticks before the traffic.
        assert!(r.sluice_round_trips >= 2 * s.nodes as u64, "{r:?}");
        let ticks = s.windows * s.limit.window_ms / s.tick_ms + 2;
        assert!(r.sluice_round_trips <= 2 * ticks * s.nodes as u64, "{r:?}");
    }
}
