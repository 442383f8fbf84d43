//! The fleet simulator behind `sluice simulate`: replicas sharing one limit through a store,
//! on a manual clock, sluice's mechanism side by side with the plain design (DESIGN §3).
//!
//! It owns a deterministic discrete-event model of a fleet: N nodes, each with its own
//! [`WindowState`] for one entity; a shared in-memory store of per-epoch counters (what Redis
//! holds under `INCRBY {entity}:{epoch}`) with a round-trip time and an optional outage; and
//! traffic spread over the nodes by a seeded generator. It owns neither the decision core
//! ([`crate::core`]) nor the real sync task (`sync.rs`); a simulated node drives the core
//! the way the sync task does — each tick (at the node's own phase), an entity queued by a hit
//! and with no sync in flight syncs when [`SyncPolicy::due`] says so: `begin_sync`, the store
//! adds the deltas half a round trip later and returns both epochs' totals, `complete_sync`
//! when the reply lands, `fail_sync` on an error followed by the task's backoff — so the
//! figures are those of the shipped mechanism, not of a model of it. A node learns about the
//! others only through those replies.
//!
//! The plain design runs on the same traffic against its own store (see `PlainNode`).
//!
//! No wall clock, no threads, no randomness beyond a seeded splitmix64: a scenario gives the
//! same table on every machine, which is what lets `tests/simulate.rs` assert its bounds.
//!
//! # What is measured
//! Per aligned window: the hits the fleet admitted, over the limit, and *false denials*: hits
//! denied although the exact algorithm (the same window formula over the fleet's true
//! admitted hits) would have let them in — the count it sees plus the hits fit the limit. A
//! false denial enters the exact model's count as if admitted, so a free slot refused to ten
//! requests in a row counts once — the one hit the fleet failed to admit — not ten times;
//! [`WindowStats::denied_with_room`] keeps the raw per-request figure.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;

use crate::core::clock::UnixMillis;
use crate::core::{decide, Algorithm, Limit, SyncPlan, SyncPolicy, Tier, WindowState};

/// A Unix time aligned to every window the scenarios use, where every simulation starts.
const T0: u64 = 1_700_000_040_000;

/// The sync task's backoff after a failed call (`sync.rs`): the next tick comes
/// `max(backoff, tick)` after the failure, the backoff doubling from 200 ms up to 5 s.
const BACKOFF_MIN_MS: u64 = 200;
const BACKOFF_MAX_MS: u64 = 5_000;

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
    /// How many windows are run and reported; the run starts at a window boundary.
    pub windows: u64,
    /// Seed of the traffic and of the tick phases.
    pub seed: u64,
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
}

/// The outcome of one scenario: window by window, sluice and the plain design.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The scenario's name.
    pub scenario: &'static str,
    /// The limit per window.
    pub limit: u32,
    /// sluice, window by window.
    pub sluice: Vec<WindowStats>,
    /// The plain design (decay of the last read + tier cadence), window by window.
    pub baseline: Vec<WindowStats>,
    /// Store round trips sluice made (all nodes, whole run).
    pub sluice_round_trips: u64,
    /// Store round trips the plain design made.
    pub baseline_round_trips: u64,
}

impl Report {
    /// sluice's admitted hits in window `i` (0-based), over the limit.
    pub fn sluice_admitted(&self, i: usize) -> f64 {
        self.share(self.sluice[i].admitted)
    }

    /// The plain design's admitted hits in window `i`, over the limit.
    pub fn baseline_admitted(&self, i: usize) -> f64 {
        self.share(self.baseline[i].admitted)
    }

    /// sluice's false denials in window `i`, over the limit.
    pub fn sluice_false_denials(&self, i: usize) -> f64 {
        self.share(self.sluice[i].false_denials)
    }

    /// The plain design's false denials in window `i`, over the limit.
    pub fn baseline_false_denials(&self, i: usize) -> f64 {
        self.share(self.baseline[i].false_denials)
    }

    fn share(&self, hits: u64) -> f64 {
        hits as f64 / f64::from(self.limit.max(1))
    }
}

/// The five named scenarios. All use 20 nodes, a limit of 1000 per 60 s sliding window (the
/// default algorithm), a 1 s tick, a 2 ms round trip and 4 windows, unless said otherwise.
pub fn scenarios() -> Vec<Scenario> {
    const W: u64 = 60_000;
    let base = Scenario {
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
        windows: 4,
        seed: 0x5eed_0001,
    };
    let even = |from_ms, until_ms, times_limit| Load {
        from_ms,
        until_ms,
        times_limit,
        hot_share: None,
    };
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
            ..base
        },
    ]
}

/// Runs every scenario and renders the table (what `sluice simulate` prints).
pub fn run_all() -> String {
    let reports: Vec<Report> = scenarios().iter().map(run).collect();
    let mut out = String::from(
        "Fleet simulation: sluice beside the plain design (decay of the last count read, reads \
         on the tier cadence), on the same traffic.\n\
         False denials: hits the exact limiter would have admitted, as a share of the limit.\n\n",
    );
    out.push_str(&render_table(&reports));
    out
}

/// Runs one scenario, for sluice and for the plain design, on the same traffic.
pub fn run(scenario: &Scenario) -> Report {
    let arrivals = arrivals(scenario);
    let mut rng = SplitMix64(scenario.seed ^ 0x7469_636b);
    let phases: Vec<u64> = (0..scenario.nodes)
        .map(|_| rng.next() % scenario.tick_ms.max(1))
        .collect();
    let policy = SyncPolicy {
        tick_ms: scenario.tick_ms,
        ..SyncPolicy::default()
    };
    let sluice_nodes = (0..scenario.nodes)
        .map(|_| SluiceNode::new(policy))
        .collect();
    let (sluice, sluice_round_trips) =
        simulate::<SluiceNode>(scenario, &arrivals, &phases, sluice_nodes);
    let baseline_nodes = (0..scenario.nodes).map(|_| PlainNode::default()).collect();
    let (baseline, baseline_round_trips) =
        simulate::<PlainNode>(scenario, &arrivals, &phases, baseline_nodes);
    Report {
        scenario: scenario.name,
        limit: scenario.limit.requests_per_unit,
        sluice,
        baseline,
        sluice_round_trips,
        baseline_round_trips,
    }
}

/// A Markdown table: one row per scenario and window, sluice beside the plain design.
pub fn render_table(reports: &[Report]) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | window | offered/limit | sluice admitted/limit | plain admitted/limit \
         | sluice false denials | plain false denials |\n",
    );
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in reports {
        let limit = f64::from(r.limit);
        for (i, (s, b)) in r.sluice.iter().zip(&r.baseline).enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.3} | {:.3} | {:.1} % | {:.1} % |",
                r.scenario,
                i + 1,
                s.offered as f64 / limit,
                s.admitted as f64 / limit,
                b.admitted as f64 / limit,
                100.0 * s.false_denials as f64 / limit,
                100.0 * b.false_denials as f64 / limit,
            );
        }
    }
    out
}

// === traffic ===

/// splitmix64: a tiny, well-mixed, seeded generator (no crate, same numbers everywhere).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Every hit of the run as (ms from the start, node), in time order. Hits of a load are evenly
/// spaced in time; each goes to a node drawn by the seeded generator.
fn arrivals(s: &Scenario) -> Vec<(u64, usize)> {
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
                Some(share) if s.nodes > 1 => {
                    if rng.unit() < share {
                        0
                    } else {
                        1 + (rng.next() % (s.nodes as u64 - 1)) as usize
                    }
                }
                _ => (rng.next() % s.nodes as u64) as usize,
            };
            out.push((t, node));
        }
    }
    out.sort_by_key(|&(t, _)| t);
    out
}

// === the store ===

/// A request to the store: deltas to add to two epochs' counters, whose totals come back.
#[derive(Debug, Clone, Copy)]
struct StoreCall {
    epochs: [u64; 2],
    deltas: [i64; 2],
}

/// The shared store: per-epoch counters, as Redis holds them.
#[derive(Default)]
struct Store {
    counts: HashMap<u64, i64>,
}

impl Store {
    fn apply(&mut self, call: &StoreCall) -> [u64; 2] {
        std::array::from_fn(|i| {
            let c = self.counts.entry(call.epochs[i]).or_default();
            *c += call.deltas[i];
            (*c).max(0) as u64
        })
    }
}

// === the nodes ===

/// One replica under simulation, as the event loop drives it.
trait Node {
    /// A hit arrives at `now`; returns whether it is admitted.
    fn hit(&mut self, limit: &Limit, now: UnixMillis) -> bool;
    /// The sync task's tick: the store call to make, if any.
    fn tick(&mut self, limit: &Limit, now: UnixMillis) -> Option<StoreCall>;
    /// The reply to the call in flight: totals and when the store applied it, or an error.
    fn reply(&mut self, limit: &Limit, now: UnixMillis, result: Option<([u64; 2], u64)>);
}

/// sluice: the real [`WindowState`], driven as the sync task (`sync.rs`) drives it.
struct SluiceNode {
    state: WindowState,
    policy: SyncPolicy,
    /// In the sync queue: set by every hit, cleared when a tick finds nothing to send or read.
    queued: bool,
    in_flight: Option<SyncPlan>,
    last_sync_start: u64,
}

impl SluiceNode {
    fn new(policy: SyncPolicy) -> Self {
        SluiceNode {
            state: WindowState::default(),
            policy,
            queued: false,
            in_flight: None,
            last_sync_start: 0,
        }
    }
}

impl Node for SluiceNode {
    fn hit(&mut self, limit: &Limit, now: UnixMillis) -> bool {
        self.queued = true;
        !decide(&mut self.state, limit, now, 1).over
    }

    fn tick(&mut self, limit: &Limit, now: UnixMillis) -> Option<StoreCall> {
        if !self.queued || self.in_flight.is_some() {
            return None;
        }
        if !self
            .policy
            .due(&self.state, limit, now, self.last_sync_start)
        {
            if self.state.pending() == 0 && self.state.ever_synced() {
                // Nothing to send: the next hit queues it again.
                self.queued = false;
            }
            return None;
        }
        let plan = self.state.begin_sync(limit, now);
        self.last_sync_start = now.0;
        self.in_flight = Some(plan);
        Some(StoreCall {
            epochs: plan.epochs,
            deltas: plan.deltas,
        })
    }

    fn reply(&mut self, limit: &Limit, now: UnixMillis, result: Option<([u64; 2], u64)>) {
        let Some(plan) = self.in_flight.take() else {
            return;
        };
        match result {
            Some((totals, _)) => {
                self.state.complete_sync(limit, &plan, totals, now);
                if self.state.pending() == 0 {
                    self.queued = false;
                }
            }
            None => self.state.fail_sync(&plan),
        }
    }
}

/// The plain design (DESIGN §3):
/// `level = max(0, synced − (limit/W) × elapsed) + local_pending`.
/// A never-read entity is allowed and queued for a read; reads follow the tier cadence with a
/// 15 s base (Idle never, Low 60 s, Normal 15 s, Hot 7.5 s); writes are flushed every tick.
/// What a read returns is the store's sliding-window count at that moment, the quantity whose
/// decay the formula models.
#[derive(Default)]
struct PlainNode {
    /// The count read and when the store produced it; `None` before the first read.
    synced: Option<(u64, u64)>,
    /// Own counted hits since the last read.
    local_pending: u64,
    /// Own counted hits not yet written, per epoch (epoch, hits), oldest first.
    unflushed: Vec<(u64, i64)>,
    /// A read is wanted at the next tick (a cache miss).
    read_queued: bool,
    last_read_ms: u64,
    in_flight: Option<PlainCall>,
}

/// A call of the plain design in flight.
struct PlainCall {
    /// The writes it carries, kept to be resent if it fails.
    wrote: Vec<(u64, i64)>,
    /// Whether it reads too.
    read: bool,
    /// `local_pending` when it was sent: the hits the read will include.
    pending_then: u64,
}

impl PlainNode {
    fn level(&self, limit: &Limit, now: UnixMillis) -> Option<u64> {
        let (count, at) = self.synced?;
        let decay = u128::from(limit.requests_per_unit) * u128::from(now.0.saturating_sub(at))
            / u128::from(limit.window_ms);
        Some(count.saturating_sub(decay.min(u128::from(u64::MAX)) as u64) + self.local_pending)
    }

    fn count(&mut self, limit: &Limit, now: UnixMillis) {
        let epoch = now.0 / limit.window_ms;
        self.local_pending += 1;
        match self.unflushed.last_mut() {
            Some((e, n)) if *e == epoch => *n += 1,
            _ => self.unflushed.push((epoch, 1)),
        }
    }
}

impl Node for PlainNode {
    fn hit(&mut self, limit: &Limit, now: UnixMillis) -> bool {
        let admitted = match self.level(limit, now) {
            None => {
                self.read_queued = true;
                true
            }
            Some(level) => {
                limit.requests_per_unit > 0 && level < u64::from(limit.requests_per_unit)
            }
        };
        if admitted || limit.algorithm == Algorithm::FixedWindow {
            self.count(limit, now);
        }
        admitted
    }

    fn tick(&mut self, limit: &Limit, now: UnixMillis) -> Option<StoreCall> {
        if self.in_flight.is_some() {
            return None;
        }
        let read = self.read_queued
            || self.level(limit, now).is_some_and(|level| {
                let pressure = level as f64 / f64::from(limit.requests_per_unit.max(1));
                let every = match Tier::of(pressure) {
                    Tier::Idle => return false,
                    Tier::Low => 60_000,
                    Tier::Normal => 15_000,
                    Tier::Hot => 7_500,
                };
                now.0.saturating_sub(self.last_read_ms) >= every
            });
        if !read && self.unflushed.is_empty() {
            return None;
        }
        // One pipeline: the writes of the two most recent epochs (older ones no longer
        // matter to any estimate), then the read of the current and previous epoch.
        let epoch = now.0 / limit.window_ms;
        let mut call = StoreCall {
            epochs: [epoch, epoch.saturating_sub(1)],
            deltas: [0; 2],
        };
        for &(e, n) in &self.unflushed {
            if e == epoch {
                call.deltas[0] += n;
            } else if e + 1 == epoch {
                call.deltas[1] += n;
            }
        }
        self.in_flight = Some(PlainCall {
            wrote: std::mem::take(&mut self.unflushed),
            read,
            pending_then: self.local_pending,
        });
        Some(call)
    }

    fn reply(&mut self, limit: &Limit, now: UnixMillis, result: Option<([u64; 2], u64)>) {
        let Some(call) = self.in_flight.take() else {
            return;
        };
        match result {
            Some((totals, applied_at)) if call.read => {
                let count = exact_estimate(limit, applied_at, totals[0], totals[1]);
                self.synced = Some((count, applied_at));
                self.local_pending -= call.pending_then;
                self.read_queued = false;
                self.last_read_ms = now.0;
            }
            Some(_) => {}
            None => {
                // Keep the writes for the next tick, ahead of newer ones.
                let newer = std::mem::replace(&mut self.unflushed, call.wrote);
                self.unflushed.extend(newer);
            }
        }
    }
}

// === the event loop ===

/// The sliding (or fixed) window count at `t` from the two epochs' counters, in the core's
/// integer arithmetic.
fn exact_estimate(limit: &Limit, t: u64, curr: u64, prev: u64) -> u64 {
    match limit.algorithm {
        Algorithm::FixedWindow => curr,
        Algorithm::SlidingWindow => {
            let w = u128::from(limit.window_ms);
            let left = w - u128::from(t % limit.window_ms);
            (u128::from(prev) * left / w) as u64 + curr
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The store applies a node's call.
    Apply(usize),
    /// The reply reaches the node.
    Reply(usize),
    /// A node's sync tick, of the given schedule (a failure starts a new one).
    Tick(usize, u64),
}

/// Runs one design over the scenario's arrivals; returns per-window stats and round trips.
fn simulate<N: Node>(
    s: &Scenario,
    arrivals: &[(u64, usize)],
    phases: &[u64],
    mut nodes: Vec<N>,
) -> (Vec<WindowStats>, u64) {
    let limit = &s.limit;
    let w = limit.window_ms;
    let end = s.windows * w;
    let epoch0 = T0 / w;
    let mut stats = vec![WindowStats::default(); s.windows as usize];
    // The exact model: the fleet's true counted hits per epoch; and the same plus the false
    // denials, counted as the exact algorithm would have admitted them.
    let epochs = s.windows as usize + 1;
    let mut truth = vec![0u64; epochs];
    let mut oracle = vec![0u64; epochs];
    let mut store = Store::default();
    let mut calls: Vec<Option<StoreCall>> = vec![None; nodes.len()];
    let mut results: Vec<Option<([u64; 2], u64)>> = vec![None; nodes.len()];
    let mut round_trips = 0;
    let mut queue = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |queue: &mut BinaryHeap<_>, t: u64, e: Event| {
        seq += 1;
        queue.push(Reverse((t, seq, e)));
    };
    for (i, &p) in phases.iter().enumerate() {
        push(&mut queue, p, Event::Tick(i, 0));
    }
    let mut schedule = vec![0u64; nodes.len()];
    let mut backoff = vec![BACKOFF_MIN_MS; nodes.len()];
    let half = s.rtt_ms / 2;
    let tick = s.tick_ms.max(1);
    let mut next_arrival = 0;
    loop {
        let event_at = queue.peek().map(|Reverse((t, _, _))| *t);
        let arrival_at = arrivals.get(next_arrival).map(|&(t, _)| t);
        let (t, event) = match (event_at, arrival_at) {
            (Some(e), Some(a)) if e <= a => (e, queue.pop().map(|Reverse((_, _, ev))| ev)),
            (Some(e), None) => (e, queue.pop().map(|Reverse((_, _, ev))| ev)),
            (_, Some(a)) => (a, None),
            (None, None) => break,
        };
        if t >= end {
            break;
        }
        let now = UnixMillis(T0 + t);
        let win = (t / w) as usize;
        match event {
            None => {
                let node = arrivals[next_arrival].1;
                next_arrival += 1;
                let e = (now.0 / w - epoch0) as usize;
                let prev = |v: &[u64]| if e == 0 { 0 } else { v[e - 1] };
                let true_count = exact_estimate(limit, now.0, truth[e], prev(&truth));
                let oracle_count = exact_estimate(limit, now.0, oracle[e], prev(&oracle));
                let rpu = u64::from(limit.requests_per_unit);
                let admitted = nodes[node].hit(limit, now);
                stats[win].offered += 1;
                if admitted {
                    stats[win].admitted += 1;
                }
                if admitted || limit.algorithm == Algorithm::FixedWindow {
                    truth[e] += 1;
                    oracle[e] += 1;
                }
                if !admitted {
                    if true_count < rpu {
                        stats[win].denied_with_room += 1;
                    }
                    if oracle_count < rpu {
                        stats[win].false_denials += 1;
                        if limit.algorithm == Algorithm::SlidingWindow {
                            oracle[e] += 1;
                        }
                    }
                }
            }
            Some(Event::Tick(i, gen)) if gen != schedule[i] => {}
            Some(Event::Tick(i, gen)) => {
                if let Some(call) = nodes[i].tick(limit, now) {
                    round_trips += 1;
                    calls[i] = Some(call);
                    push(&mut queue, t + half, Event::Apply(i));
                }
                push(&mut queue, t + tick, Event::Tick(i, gen));
            }
            Some(Event::Apply(i)) => {
                let down = s.outage.is_some_and(|(from, until)| t >= from && t < until);
                results[i] = match (calls[i].take(), down) {
                    (Some(call), false) => Some((store.apply(&call), now.0)),
                    _ => None,
                };
                push(&mut queue, t + (s.rtt_ms - half), Event::Reply(i));
            }
            Some(Event::Reply(i)) => {
                let result = results[i].take();
                if result.is_some() {
                    backoff[i] = BACKOFF_MIN_MS;
                } else {
                    schedule[i] += 1;
                    push(
                        &mut queue,
                        t + backoff[i].max(tick),
                        Event::Tick(i, schedule[i]),
                    );
                    backoff[i] = (2 * backoff[i]).min(BACKOFF_MAX_MS);
                }
                nodes[i].reply(limit, now, result);
            }
        }
    }
    (stats, round_trips)
}

#[cfg(test)]
mod tests {
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
}
