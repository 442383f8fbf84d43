//! A model of the plain design (ARCHITECTURE.md, "The plain design"), run beside sluice on the same
//! traffic and the same kind of store. It is not our code, so a model of it is what there is.
//!
//! `level = max(0, synced − (limit/W) × elapsed) + local_pending`. A never-read entity is
//! allowed and queued for a read; reads follow the tier cadence with a 15 s base (Idle never,
//! Low 60 s, Normal 15 s, Hot 7.5 s); writes are flushed every tick. What a read returns is
//! the store's sliding-window count when the store applied the call, the quantity whose decay
//! the formula models. A failed call keeps its writes for the next tick (the design states
//! no backoff).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::{sleep_until, Instant};

use super::exact::exact_estimate;
use super::fleet::SimClock;
use super::store::SimStore;
use crate::core::clock::{Clock, UnixMillis};
use crate::core::Part;
use crate::core::{Algorithm, Limit, Tier};
use crate::global::{SyncItem, SyncOp};

/// One replica of the plain design.
#[derive(Debug, Default)]
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
#[derive(Debug)]
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

    /// The tick: the call to make, if any.
    fn tick(&mut self, limit: &Limit, now: UnixMillis) -> Option<SyncItem> {
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
        let mut deltas = [0; 2];
        for &(e, n) in &self.unflushed {
            if e == epoch {
                deltas[0] += n;
            } else if e + 1 == epoch {
                deltas[1] += n;
            }
        }
        let item = SyncItem {
            entity: 0,
            limit: 0,
            op: SyncOp::Window {
                epochs: [epoch, epoch.saturating_sub(1)],
                // INCRBY semantics: each call's deltas land as a part of their own
                // (`sync_task` names each call anew), added once and never restored.
                parts: deltas.map(|d| Part {
                    hits: d.max(0) as u64,
                    refunds: 0,
                }),
                // Reads as they are: the plain design keeps no floor.
                floors: [0, 0],
                ttl_ms: 2 * limit.window_ms,
            },
        };
        self.in_flight = Some(PlainCall {
            wrote: std::mem::take(&mut self.unflushed),
            read,
            pending_then: self.local_pending,
        });
        Some(item)
    }

    /// The reply: both epochs' totals and when the store applied the call, or an error.
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

/// The plain design's replicas of one run, their sync tasks started.
pub struct PlainFleet {
    nodes: Vec<Arc<Mutex<PlainNode>>>,
    limit: Limit,
    clock: SimClock,
    /// When each replica takes traffic: once started (it has nothing to wait for).
    ready_from: Vec<Instant>,
}

impl PlainFleet {
    /// Starts one replica per phase on `store`; replica `i` ticks at `zero + phases[i]` and
    /// every `tick_ms` after, as sluice's do. Must run inside the simulation's runtime.
    pub fn start(
        limit: &Limit,
        tick_ms: u64,
        clock: SimClock,
        store: &Arc<SimStore>,
        phases: &[u64],
    ) -> PlainFleet {
        let nodes: Vec<_> = phases
            .iter()
            .map(|&phase| {
                let node = Arc::new(Mutex::new(PlainNode::default()));
                let first = clock.zero + Duration::from_millis(phase);
                let tick = Duration::from_millis(tick_ms.max(1));
                tokio::spawn(sync_task(
                    node.clone(),
                    *limit,
                    clock,
                    store.clone(),
                    first,
                    tick,
                ));
                node
            })
            .collect();
        PlainFleet {
            ready_from: vec![Instant::now(); nodes.len()],
            nodes,
            limit: *limit,
            clock,
        }
    }

    /// Starts replica `i` at `zero + starts[i]` ms (at most two ticks before `zero`), ticking
    /// from then on; it takes traffic from its start.
    pub fn start_at(
        limit: &Limit,
        tick_ms: u64,
        clock: SimClock,
        store: &Arc<SimStore>,
        starts: &[i64],
    ) -> PlainFleet {
        let tick = tick_ms.max(1) as i64;
        let phases: Vec<u64> = starts
            .iter()
            .map(|&at| at.rem_euclid(tick) as u64)
            .collect();
        let ready_from = starts
            .iter()
            .map(|&at| match u64::try_from(at) {
                Ok(after) => clock.zero + Duration::from_millis(after),
                Err(_) => clock.zero - Duration::from_millis(at.unsigned_abs()),
            })
            .collect();
        PlainFleet {
            ready_from,
            ..PlainFleet::start(limit, tick_ms, clock, store, &phases)
        }
    }

    /// Whether node `node` takes traffic.
    pub fn ready(&self, node: usize) -> bool {
        Instant::now() >= self.ready_from[node]
    }

    /// Node `node` answers one hit: whether it is admitted.
    pub fn hit(&self, node: usize) -> bool {
        self.nodes[node].lock().hit(&self.limit, self.clock.now())
    }
}

/// Names every plain call's part apart (`sync_task`).
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One plain replica's tick loop: flush (and read when due) every tick, one call at a time.
async fn sync_task(
    node: Arc<Mutex<PlainNode>>,
    limit: Limit,
    clock: SimClock,
    store: Arc<SimStore>,
    first: Instant,
    tick: Duration,
) {
    let mut next = first;
    loop {
        sleep_until(next).await;
        let item = node.lock().tick(&limit, clock.now());
        if let Some(item) = item {
            // A part per call: what `INCRBY` does with each call's deltas.
            let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let result = store.sync(call, &[item]).await;
            let now = clock.now();
            let applied_at = now.0 - store.return_trip().as_millis() as u64;
            let totals = result.ok().and_then(|t| t.first().copied());
            node.lock()
                .reply(&limit, now, totals.map(|t| (t, applied_at)));
        }
        // A tick that falls while a call is in flight is skipped.
        next += tick;
        while next < Instant::now() {
            next += tick;
        }
    }
}
