//! The simulated shared store: the in-memory [`MemoryStore`] (counters and heartbeats) behind
//! a network round trip and an optional outage, on tokio's (paused) clock.
//!
//! A call travels half the round trip, is applied (or refused, during the outage) by the
//! counters, and its answer travels the other half: so a reply is as stale as a real one,
//! and another node's call can land in between. Both designs of a run use a store of their
//! own, so they never see each other's counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use crate::global::memory::MemoryStore;
use crate::global::store::Heartbeat;
use crate::global::{ShardStore, StoreError, SyncItem};

/// A [`ShardStore`] shared by every node of one simulated fleet.
#[derive(Debug)]
pub struct SimStore {
    counters: MemoryStore,
    /// The first half of the round trip (to the store) and the rest (back).
    there: Duration,
    back: Duration,
    /// When the store is down, as instants of the simulated clock (half-open).
    outage: Option<(Instant, Instant)>,
    /// Calls made, failed ones included.
    round_trips: AtomicU64,
}

impl SimStore {
    /// A store `rtt_ms` away, down over `outage` (ms after `zero`, the start of the traffic).
    pub fn new(rtt_ms: u64, outage: Option<(u64, u64)>, zero: Instant) -> Self {
        let ms = Duration::from_millis;
        SimStore {
            counters: MemoryStore::default(),
            there: ms(rtt_ms / 2),
            back: ms(rtt_ms - rtt_ms / 2),
            outage: outage.map(|(from, until)| (zero + ms(from), zero + ms(until))),
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

impl ShardStore for SimStore {
    fn name(&self) -> &str {
        "sim"
    }

    async fn sync(&self, items: &[SyncItem]) -> Result<Vec<[u64; 2]>, StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        sleep(self.there).await;
        // Whether the call is refused is decided where it lands, as a connection to a dead
        // Redis fails there; the error still takes the way back.
        let result = if self.is_down(Instant::now()) {
            Err(StoreError::Backend("simulated outage".into()))
        } else {
            self.counters.sync(items).await
        };
        sleep(self.back).await;
        result
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<u32, StoreError> {
        self.sync_and_beat(&[], beat)
            .await?
            .1
            .ok_or_else(|| StoreError::Backend("no heartbeat reply".into()))
    }

    async fn sync_and_beat(
        &self,
        items: &[SyncItem],
        beat: &Heartbeat,
    ) -> Result<(Vec<[u64; 2]>, Option<u32>), StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        sleep(self.there).await;
        let result = if self.is_down(Instant::now()) {
            Err(StoreError::Backend("simulated outage".into()))
        } else {
            match self.counters.sync(items).await {
                Ok(totals) => Ok((totals, self.counters.heartbeat(beat).await.ok())),
                Err(e) => Err(e),
            }
        };
        sleep(self.back).await;
        result
    }

    async fn time_ms(&self) -> Result<u64, StoreError> {
        self.counters.time_ms().await
    }
}
