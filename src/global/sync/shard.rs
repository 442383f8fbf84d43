//! Global mode's background sync: per-shard queues of entities with news, and one task per
//! shard that every tick moves their hits to the shared store and the fleet's counts back.
//!
//! The hot path never waits on this: a request counts locally and, the first time an entity
//! has news, queues it on its shard ([`SyncQueues::mark_dirty`], under its table shard's lock).
//! Each tick a shard task takes the entities that are due by [`SyncPolicy`] (cold ones at
//! once, hot ones every tick), turns their pending hits into in-flight deltas
//! ([`WindowState::begin_sync`]), and makes **one** call to its [`ShardStore`], which keeps
//! this node's part of each counter as the call states it (whole, so a call resent after a
//! timeout that ran all the same counts nothing twice, and a store that restarted empty gets
//! it back: `store.rs`) and returns both epochs' totals. The replies settle the deltas
//! (`complete_sync`), so a node's own hits are counted exactly once. A failed call puts the
//! deltas back (`fail_sync`), marks the shard degraded and backs off; the hot path keeps
//! deciding from memory meanwhile. Which entities a trip carries and what its reply does to
//! them is `plan.rs`'s.
//!
//! The tick's call also carries this replica's heartbeat ([`Heartbeat`]); its reply, the
//! live replica count, goes to [`Fleet::observe_live`], where the hot path reads it, and
//! the store's generation to [`ShardHealth::observe_generation`], which tells a store that
//! lost the sync's keys (`store.rs`), and its read of the reset log to [`clear_views`], which
//! clears this replica's view of the keys reset through others (`reset_log.rs`,
//! `reset_views.rs`). The final
//! flush removes the heartbeat. A cold entity
//! queued between ticks wakes the task for an early round trip (the due entities only, no
//! heartbeat), at most one between two ticks.
//! A young entity running into its prior in a burst wakes it for *burst reads* (the same,
//! and their replies measure the others however soon they come: `core/window/prior.rs`), at most
//! one every [`BURST_MIN_GAP`] and [`MAX_BURST_TRIPS`] between two ticks. Burst reads are
//! the one exception to a call at a time: up to [`READS_IN_FLIGHT`] go at once, the later
//! one reading again the entities the earlier still holds in flight (`EntityState::in_flight`
//! counts them; whichever settles last requeues or releases the entity). Their replies are
//! settled in the order they started, and the tick, an early trip and the final flush wait
//! until none is under way.
//!
//! Accuracy trade-off: between two syncs a node knows other nodes' hits only by extrapolating
//! the rate it saw between replies; `core/window/share.rs` and `core/window/prior.rs` explain the estimate.
//!
//! [`WindowState::begin_sync`]: crate::core::WindowState::begin_sync
//! [`SyncPolicy`]: crate::core::tier::SyncPolicy

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio_util::sync::CancellationToken;

use super::fleet::Fleet;
use super::health::ShardHealth;
use super::in_flight::{put_back, InFlight};
use super::queue::SyncQueues;
use super::reset_log::ResetRead;
use super::reset_views::clear_views;
use super::settings::SyncSettings;
use super::store::Trip as StoreTrip;
use super::store::{new_generation, Beat, Heartbeat, ShardStore, StoreError, SyncItem};
use crate::core::clock::Clock;
use crate::core::table::EntityTable;

/// The most burst reads (`core/window/prior.rs`) a shard makes between two ticks: half of what
/// [`BURST_MIN_GAP`] lets through in the 100 ms after a young entity's first reply during
/// which it may want them (`BURST_WINDOW_MS`). A burst stops wanting them once a reply shows
/// the limit reached: a 10× burst on a limit of 1,000 takes about 9 a replica in the
/// simulator (5 a call at a time), a 2× one about 40 (20).
pub const MAX_BURST_TRIPS: u32 = 50;

/// The most send trips a shard makes between two ticks: early round trips for young
/// entities whose replica denies them, or whose unsent hits reached a quarter of their
/// prior (`core/window/prior.rs`, `SyncQueues::want_early_trip`). Apart from the one early trip a
/// cold entity wakes, so that a flood of new values never takes a young entity's sends:
/// on two replicas a send taken that way left a young replica's 173 hits unsent for half a
/// tick, and the other replica settled on a read without them (1.155× the limit).
const MAX_SEND_TRIPS: u32 = 4;

/// The least time between the starts of two burst reads of a shard. With
/// [`READS_IN_FLIGHT`] under way at once, a round trip of 2 ms holds two, a millisecond
/// apart: each reply shows the others' hits up to half a round trip before the last one.
/// On a Redis nearer than this, this paces them.
const BURST_MIN_GAP: Duration = Duration::from_millis(1);

/// The most burst reads of a shard under way at once. A burst reaches the limit within a
/// few round trips, and a read a round trip old misses the others' hits of that round trip:
/// a second read started while the first is in flight halves that. Both are settled in the
/// order they started; the core counts an entity's deltas in flight as a sum, so two reads
/// of it under way settle exactly whichever the store applies first (a pool may reorder
/// them: the first reply then shows the second's hits early, a brief overcount).
const READS_IN_FLIGHT: usize = 2;

/// One shard's sync task.
pub struct ShardSync<S> {
    /// The shard's index.
    pub index: usize,
    /// Its store.
    pub store: Arc<S>,
    /// The queues.
    pub queues: Arc<SyncQueues>,
    /// The table whose entities are queued (the limiter's, built once by the wiring).
    pub table: EntityTable,
    /// What the heartbeats say of the fleet: the tick replies write it.
    pub fleet: Arc<Fleet>,
    /// Its health.
    pub health: Arc<ShardHealth>,
    /// The clock decisions use.
    pub clock: Arc<dyn Clock>,
    /// Cadence and limits.
    pub settings: SyncSettings,
}

impl<S> Clone for ShardSync<S> {
    fn clone(&self) -> Self {
        ShardSync {
            index: self.index,
            store: self.store.clone(),
            queues: self.queues.clone(),
            table: self.table.clone(),
            fleet: self.fleet.clone(),
            health: self.health.clone(),
            clock: self.clock.clone(),
            settings: self.settings,
        }
    }
}

/// A round trip begun: its entities (owned by the guard until the reply is settled), what
/// its call sends, and whether the call's size left due entities for another (`more`).
struct Started<'a> {
    trip: Trip,
    guard: InFlight<'a>,
    items: Vec<SyncItem>,
    beat: Option<Heartbeat>,
    more: bool,
}

/// A round trip's call answered, its reply not settled yet.
struct Answered<'a> {
    trip: Trip,
    guard: InFlight<'a>,
    items: usize,
    took: Duration,
    more: bool,
    result: Result<(Vec<[u64; 2]>, Option<Beat>), StoreError>,
}

/// What a round trip is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trip {
    /// The tick: the due entities and the heartbeat.
    Tick,
    /// Woken by a cold entity between ticks: the due entities only, if any.
    Early,
    /// Woken by a young entity running into its prior: the due entities only, if any, and
    /// the replies measure the others' rate however soon they come (`core/window/prior.rs`).
    Burst,
    /// Shutdown: everything pending, and the heartbeat removed.
    Flush,
    /// Right after a call that had no room for every due entity: the next of them, if any,
    /// at the store's pace (`batch.rs`).
    Drain,
}

impl<S: ShardStore> ShardSync<S> {
    /// Ticks until `shutdown`, then makes a final flush of everything pending. The first tick
    /// is at once, so the fleet's size is known before long; a cold entity queued between
    /// ticks wakes the task for an early round trip, at most one between two ticks; a young
    /// one in a burst, for burst reads, up to [`READS_IN_FLIGHT`] of them under way at once.
    /// Everything else waits for the burst reads under way to be settled, in the order they
    /// started, so that ticks, early trips and the flush still go one at a time.
    pub async fn run(self, shutdown: CancellationToken) {
        self.fleet.set_tick_ms(self.settings.policy.tick_ms);
        let tick = Duration::from_millis(self.settings.policy.tick_ms);
        let mut backoff = self.settings.backoff_min;
        let mut next = tokio::time::Instant::now();
        let mut early_done = false;
        let mut sends = 0;
        let mut bursts = 0;
        let mut burst_wanted = false;
        let mut burst_ready = tokio::time::Instant::now();
        // The burst reads under way, answered in the order they started, and the entities of
        // the last one (the next may read them again before it is answered).
        let mut reads = FuturesOrdered::new();
        let mut last_read: Vec<u128> = Vec::new();
        // Due entities a call had no room for: drained by calls back to back, each waiting
        // for the one before (the tick, woken trips and burst reads go first).
        let mut backlog = false;
        loop {
            let early_ok = !early_done && !self.health.is_degraded();
            let send_ok = sends < MAX_SEND_TRIPS && !self.health.is_degraded();
            let burst_ok = bursts < MAX_BURST_TRIPS && !self.health.is_degraded();
            let read_ok = burst_wanted && burst_ok && reads.len() < READS_IN_FLIGHT;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(answered) = reads.next(), if !reads.is_empty() => {
                    let _ = self.finish(answered);
                    continue;
                }
                _ = tokio::time::sleep_until(next) => {}
                _ = self.queues.woken(self.index), if early_ok => {
                    early_done = true;
                    self.settle_reads(&mut reads).await;
                    // A failure marks the shard degraded: no more early trips until it answers.
                    backlog |= self.trip(Trip::Early).await.unwrap_or(false);
                    continue;
                }
                _ = self.queues.send_woken(self.index), if send_ok => {
                    sends += 1;
                    self.settle_reads(&mut reads).await;
                    backlog |= self.trip(Trip::Early).await.unwrap_or(false);
                    continue;
                }
                _ = tokio::time::sleep_until(burst_ready), if read_ok => {
                    burst_wanted = false;
                    bursts += 1;
                    burst_ready = tokio::time::Instant::now() + BURST_MIN_GAP;
                    let also = if reads.is_empty() { &[][..] } else { &last_read[..] };
                    if let Some(started) = self.start(Trip::Burst, also) {
                        last_read = started.guard.planned.iter().map(|p| p.key).collect();
                        reads.push_back(self.send(started));
                    }
                    continue;
                }
                _ = self.queues.burst_woken(self.index), if burst_ok && !burst_wanted => {
                    burst_wanted = true;
                    continue;
                }
                _ = std::future::ready(()), if backlog && !self.health.is_degraded() => {
                    self.settle_reads(&mut reads).await;
                    backlog = self.trip(Trip::Drain).await.unwrap_or(false);
                    continue;
                }
            }
            self.settle_reads(&mut reads).await;
            self.forget_wakeups();
            early_done = false;
            sends = 0;
            burst_wanted = false;
            bursts = 0;
            backlog = self.scheduled_tick(tick, &mut next, &mut backoff).await;
        }
        self.settle_reads(&mut reads).await;
        loop {
            match self.tick(true).await {
                Ok(true) => continue,
                Ok(false) => tracing::info!(shard = %self.health.name, "final flush done"),
                Err(e) => {
                    tracing::error!(shard = %self.health.name, error = %e, "final flush failed; unsent hits are lost")
                }
            }
            break;
        }
    }

    /// Wake-ups up to now are served by the tick about to run.
    fn forget_wakeups(&self) {
        let _ = futures_util::FutureExt::now_or_never(self.queues.woken(self.index));
        let _ = futures_util::FutureExt::now_or_never(self.queues.burst_woken(self.index));
        let _ = futures_util::FutureExt::now_or_never(self.queues.send_woken(self.index));
    }

    /// A tick of [`ShardSync::run`], and when the next is due: `tick` after this one's time,
    /// or after a backoff (doubling up to the most) when it failed. Returns whether due
    /// entities are left for more calls.
    async fn scheduled_tick(
        &self,
        tick: Duration,
        next: &mut tokio::time::Instant,
        backoff: &mut Duration,
    ) -> bool {
        match self.tick(false).await {
            Ok(more) => {
                *backoff = self.settings.backoff_min;
                *next += tick;
                // After a long stall, tick from now rather than catching up in a burst.
                *next = (*next).max(tokio::time::Instant::now());
                more
            }
            Err(_) => {
                *next = tokio::time::Instant::now() + (*backoff).max(tick);
                *backoff = (*backoff * 2).min(self.settings.backoff_max);
                false
            }
        }
    }

    /// Waits for the burst reads under way and settles them, in the order they started.
    async fn settle_reads<'a, F>(&'a self, reads: &mut FuturesOrdered<F>)
    where
        F: Future<Output = Answered<'a>>,
    {
        while let Some(answered) = reads.next().await {
            let _ = self.finish(answered);
        }
    }

    /// One tick: syncs the due entities (all entities with pending hits when `flush`) and
    /// refreshes this replica's heartbeat (removes it when `flush`), in one round trip. The
    /// heartbeat goes even when nothing is due, so readiness tells the truth without traffic.
    /// Returns whether due entities are left that the call had no room for (or that a call
    /// too large for the timeout put back): the caller drains them with more calls.
    ///
    /// # Errors
    /// The store's error; the deltas are kept for the next tick.
    pub async fn tick(&self, flush: bool) -> Result<bool, StoreError> {
        self.trip(if flush { Trip::Flush } else { Trip::Tick })
            .await
    }

    /// How long a heartbeat lasts unrefreshed (`SyncSettings::heartbeat_ttl_ms`).
    pub(super) fn heartbeat_ttl_ms(&self) -> u64 {
        self.settings.heartbeat_ttl_ms()
    }

    async fn trip(&self, trip: Trip) -> Result<bool, StoreError> {
        match self.start(trip, &[]) {
            Some(started) => self.finish(self.send(started).await),
            None => Ok(false),
        }
    }

    /// Begins a round trip: plans the due entities (and, for a burst read, those of `also`
    /// that the burst read under way holds), and the heartbeat on a tick. `None` when a trip
    /// between ticks has nothing to send.
    fn start(&self, trip: Trip, also: &[u128]) -> Option<Started<'_>> {
        self.queues.stats.ticks.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let (planned, items, more) = self.plan(trip, now, also);
        // Until the reply is settled, the guard owns the in-flight entities: if the call
        // panics, dropping it puts their deltas back and requeues them, so a restarted task
        // sends them (see `global::supervise`).
        let guard = InFlight {
            planned,
            queues: &self.queues,
            table: &self.table,
            index: self.index,
        };
        let between_ticks = matches!(trip, Trip::Early | Trip::Burst | Trip::Drain);
        if items.is_empty() && between_ticks {
            return None;
        }
        let beat = (!between_ticks).then(|| Heartbeat {
            replica: self.fleet.replica_id(),
            now_ms: now.0,
            ttl_ms: self.heartbeat_ttl_ms(),
            leaving: trip == Trip::Flush,
            new_generation: new_generation(),
            resets: if trip == Trip::Tick {
                self.health.reset_log.read()
            } else {
                ResetRead::Skip
            },
        });
        Some(Started {
            trip,
            guard,
            items,
            beat,
            more,
        })
    }

    /// Makes the store call of a round trip begun.
    async fn send<'a>(&'a self, started: Started<'a>) -> Answered<'a> {
        let (result, took) = self.call(&started.items, started.beat.as_ref()).await;
        Answered {
            trip: started.trip,
            guard: started.guard,
            items: started.items.len(),
            took,
            more: started.more,
            result,
        }
    }

    /// Settles a round trip's answer: the replies taken in, or the deltas put back. Returns
    /// whether due entities are left for another call: those the call had no room for, or
    /// its own when it timed out for its size (put back first in the queue, the shard not
    /// marked degraded: `batch.rs`).
    fn finish(&self, answered: Answered<'_>) -> Result<bool, StoreError> {
        let Answered {
            trip,
            mut guard,
            items,
            took,
            more,
            result,
        } = answered;
        let stats = &self.queues.stats;
        let planned = std::mem::take(&mut guard.planned);
        let done = self.clock.now();
        let batch = &self.health.batch;
        match result {
            Err(StoreError::Timeout(_)) if batch.timed_out(items) => {
                stats.calls_resized.fetch_add(1, Ordering::Relaxed);
                let requeue = put_back(&self.table, planned);
                self.queues.requeue_first(self.index, requeue.into());
                Ok(true)
            }
            Ok((totals, beat)) => {
                stats.calls_ok.fetch_add(1, Ordering::Relaxed);
                batch.answered(items, took, self.settings.timeout);
                self.health.ok(done);
                if let (Some(b), Trip::Tick) = (&beat, trip) {
                    self.fleet.observe_live(b.live, done);
                }
                if let Some(generation) = beat.as_ref().and_then(|b| b.generation) {
                    self.health.observe_generation(generation, done);
                }
                self.settle(planned, totals, done);
                // After the replies: a reset logged after the store answered them clears them.
                if let Some(news) = beat.and_then(|b| b.resets) {
                    let reset = self.health.reset_log.take(news);
                    clear_views(&self.table, &self.queues, self.index, &reset);
                }
                Ok(more)
            }
            Err(e) => {
                stats.calls_failed.fetch_add(1, Ordering::Relaxed);
                self.health.failed(&e, done);
                let requeue = put_back(&self.table, planned);
                if trip == Trip::Flush {
                    let lost: i64 = requeue
                        .iter()
                        .filter_map(|&key| {
                            self.table.get(key, |e| {
                                e.state
                                    .states
                                    .iter()
                                    .map(|w| w.pending().max(0))
                                    .sum::<i64>()
                            })
                        })
                        .sum();
                    stats
                        .deltas_dropped
                        .fetch_add(lost as u64, Ordering::Relaxed);
                }
                self.queues.requeue(self.index, requeue);
                Err(e)
            }
        }
    }

    /// The store call (with the heartbeat, when given), within the timeout, with its
    /// counters. Returns the totals and, with a heartbeat, its reply; and how long it took.
    async fn call(
        &self,
        items: &[SyncItem],
        beat: Option<&Heartbeat>,
    ) -> (Result<(Vec<[u64; 2]>, Option<Beat>), StoreError>, Duration) {
        let stats = &self.queues.stats;
        stats
            .items_sent
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        let beats = beat.map_or(0, |_| self.store.commands_for_beat());
        let commands = self.store.commands_for(items.len()) + beats;
        stats
            .commands_sent
            .fetch_add(commands as u64, Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let trip = StoreTrip {
            items,
            beat,
            publish: None,
        };
        let call = async {
            let answer = self.store.round_trip(self.fleet.replica_id(), trip).await?;
            Ok::<_, StoreError>((answer.totals, answer.beat))
        };
        let result = match tokio::time::timeout(self.settings.timeout, call).await {
            Ok(Ok((totals, live))) if totals.len() == items.len() => Ok((totals, live)),
            Ok(Ok((totals, _))) => Err(StoreError::reply(format!(
                "store answered {} totals for {} items",
                totals.len(),
                items.len()
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout(self.settings.timeout)),
        };
        let took = started.elapsed();
        stats
            .call_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        (result, took)
    }
}

#[cfg(test)]
#[path = "shard_tests.rs"]
pub(super) mod tests;
