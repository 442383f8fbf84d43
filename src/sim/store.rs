//! The simulated shared store: the in-memory [`MemoryStore`] (counters and heartbeats) behind
//! a network round trip, with an optional outage and an optional restart that loses every
//! counter, on tokio's (paused) clock.
//!
//! A call travels half the round trip, is applied (or refused, during the outage) by the
//! counters, and its answer travels the other half: so a reply is as stale as a real one,
//! and another node's call can land in between. Both designs of a run use a store of their
//! own, so they never see each other's counts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use crate::global::memory::MemoryStore;
use crate::global::sync::beat_in_one;
use crate::global::{Answer, Others, Presence, ShardStore, StoreError, SyncItem, Trip};
use crate::global::{Beat, Heartbeat};

/// A [`ShardStore`] shared by every node of one simulated fleet.
#[derive(Debug)]
pub struct SimStore {
    counters: MemoryStore,
    /// The first half of the round trip (to the store) and the rest (back).
    there: Duration,
    back: Duration,
    /// When the store is down, as instants of the simulated clock (half-open).
    outage: Option<(Instant, Instant)>,
    /// When the store restarts empty, and whether it has.
    restart: Option<Instant>,
    restarted: AtomicBool,
    /// Calls made, failed ones included.
    round_trips: AtomicU64,
}

impl SimStore {
    /// A store `rtt_ms` away, down over `outage` and restarting empty at `restart` (ms after
    /// `zero`, the start of the traffic).
    pub fn new(
        rtt_ms: u64,
        outage: Option<(u64, u64)>,
        restart: Option<u64>,
        zero: Instant,
    ) -> Self {
        let ms = Duration::from_millis;
        SimStore {
            counters: MemoryStore::default(),
            there: ms(rtt_ms / 2),
            back: ms(rtt_ms - rtt_ms / 2),
            outage: outage.map(|(from, until)| (zero + ms(from), zero + ms(until))),
            restart: restart.map(|at| zero + ms(at)),
            restarted: AtomicBool::new(false),
            round_trips: AtomicU64::new(0),
        }
    }

    /// Calls made so far, failed ones included.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// How long an answer takes to come back after the store applied the call.
    pub fn return_trip(&self) -> Duration {
        self.back
    }

    fn is_down(&self, at: Instant) -> bool {
        self.outage
            .is_some_and(|(from, until)| at >= from && at < until)
    }
}

impl SimStore {
    /// One round trip: half of it out, the call applied (or refused) where it lands, half back.
    async fn call(
        &self,
        replica: u64,
        items: &[SyncItem],
        beat: Option<&Heartbeat>,
    ) -> Result<(Vec<[u64; 2]>, Option<Beat>), StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        sleep(self.there).await;
        // Whether the call is refused is decided where it lands, as a connection to a dead
        // Redis fails there; the error still takes the way back.
        let landed = Instant::now();
        // Nothing reads the counters between calls, so losing them when the first call after
        // the restart lands is losing them at the restart.
        if self.restart.is_some_and(|at| landed >= at)
            && !self.restarted.swap(true, Ordering::Relaxed)
        {
            self.counters.flush_all();
        }
        let result = if self.is_down(landed) {
            Err(StoreError::connection("simulated outage"))
        } else {
            match self.counters.sync(replica, items).await {
                Ok(totals) => match beat {
                    Some(b) => Ok((totals, self.counters.heartbeat(b).await.ok())),
                    None => Ok((totals, None)),
                },
                Err(e) => Err(e),
            }
        };
        sleep(self.back).await;
        result
    }
}

impl SimStore {
    pub async fn sync(
        &self,
        replica: u64,
        items: &[SyncItem],
    ) -> Result<Vec<[u64; 2]>, StoreError> {
        Ok(self.call(replica, items, None).await?.0)
    }

    pub async fn sync_and_beat(
        &self,
        replica: u64,
        items: &[SyncItem],
        beat: &Heartbeat,
    ) -> Result<(Vec<[u64; 2]>, Option<Beat>), StoreError> {
        self.call(replica, items, Some(beat)).await
    }

    /// The same round trip and outage as a sync call (the RLQS scenarios' replicas).
    pub async fn presence(
        &self,
        replica: u64,
        items: &[Presence],
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<Others>, StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        sleep(self.there).await;
        let result = if self.is_down(Instant::now()) {
            Err(StoreError::connection("simulated outage"))
        } else {
            self.counters.presence(replica, items, now_ms, ttl_ms).await
        };
        sleep(self.back).await;
        result
    }
}

impl ShardStore for SimStore {
    fn name(&self) -> &str {
        "sim"
    }
    async fn round_trip(&self, replica: u64, trip: Trip<'_>) -> Result<Answer, StoreError> {
        beat_in_one(
            trip,
            |items| self.sync(replica, items),
            |items, beat| self.sync_and_beat(replica, items, beat),
            |p| self.presence(replica, p.items, p.now_ms, p.ttl_ms),
        )
        .await
    }

    async fn time_ms(&self) -> Result<u64, StoreError> {
        self.counters.time_ms().await
    }

    /// The same round trip and outage as a sync call (a replica joining the fleet).
    async fn replicas(&self) -> Result<Vec<(u64, u64)>, StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        sleep(self.there).await;
        let result = if self.is_down(Instant::now()) {
            Err(StoreError::connection("simulated outage"))
        } else {
            self.counters.replicas().await
        };
        sleep(self.back).await;
        result
    }
}
