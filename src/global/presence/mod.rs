//! The fleet's RLQS streams per counter: once a sync tick, this replica publishes, per
//! counter, how many Envoy streams of Envoy's quota service it holds there and their demand,
//! and learns what the other live replicas publish, so that Envoys connected to different
//! replicas share one limit (issue 21, "the fleet-wide number of Envoy streams per bucket").
//!
//! The quota service's engine (`rlqs/`, which imports `rls/` and so this module: `global`
//! must not import it back) is a [`PresenceSource`], which the wiring builds before global
//! mode and hands to [`crate::global::spawn`] (`Parts::presence`); without one no presence
//! task runs and no store call is made (the simulator's plain scenarios hand none). With
//! one, the loop runs a round at once, then one every tick: it asks the source for its
//! counters (`local`), routes each to its shard as the sync routes the entity
//! (`SyncQueues::shard_of`, never the per-second group), makes one store call per shard with
//! items (a trip's `Publish`, [`ShardStore::round_trip`]; Redis: `global/redis/presence.rs`),
//! all shards at once, and hands each shard's reply to the source (`others`) as it comes. A
//! counter the source no longer returns is sent once more with no stream, which removes this
//! replica from it at once rather than when it expires.
//!
//! No Redis I/O per report: the engine reads what the last reply said. A failed call is
//! logged once until the shard answers again, counted (`sluice_rlqs_presence_calls_total`),
//! and the source is not told anything for that shard: the engine keeps the last values and
//! judges their age itself. The next tick calls again (one call a tick: no retry storm). A
//! replica's entries count for [`ttl_ms`] (three ticks) after its last call, so a replica that
//! died stops counting soon; one that stops cleanly removes its entries at shutdown.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::sync::SyncSettings;
use crate::global::sync::{Fleet, Publish, ShardStore, StoreError, SyncQueues, Trip};

pub use crate::global::sync::store::MAX_DEMAND;
pub use crate::global::sync::{Others, Presence};

/// The RLQS engine, as the presence loop sees it (`global` must not import `rlqs`: `rlqs`
/// imports `rls`, which imports `global`, and `tests/in_process/layers.rs` forbids circles).
pub trait PresenceSource: Send + Sync + 'static {
    /// This replica's counters that have streams now (at most a bounded number: the engine
    /// bounds it).
    fn local(&self) -> Vec<Presence>;
    /// The rest of the fleet on counters `local` returned, shard by shard as replies come
    /// (a counter only this replica has: zeros).
    fn others(&self, others: &[(u128, Others)]);
}

/// Counters of the presence loop, read by the metrics.
#[derive(Debug, Default)]
pub struct PresenceStats {
    /// Store calls that answered.
    pub calls_ok: AtomicU64,
    /// Store calls that failed or timed out.
    pub calls_failed: AtomicU64,
    /// Counters sent (removals included).
    pub items_sent: AtomicU64,
}

/// How long a replica's entries count after its last call: three ticks, so one or two
/// failed or late calls do not drop it, and a replica that died stops counting soon.
pub fn ttl_ms(tick_ms: u64) -> u64 {
    3 * tick_ms.max(1)
}

/// The presence loop of one replica, over the main group's shards.
pub(in crate::global) struct PresenceLoop<S> {
    /// The quota service's engine: asked each tick, told what the fleet answered.
    pub(in crate::global) source: Arc<dyn PresenceSource>,
    /// Where the calls are counted (the metrics read them).
    pub(in crate::global) stats: Arc<PresenceStats>,
    /// The main group's shards, indexed as `SyncQueues::shard_of` numbers them.
    pub(in crate::global) stores: Vec<Arc<S>>,
    pub(in crate::global) queues: Arc<SyncQueues>,
    /// This replica's id, which its published streams are counted under.
    pub(in crate::global) fleet: Arc<Fleet>,
    pub(in crate::global) clock: Arc<dyn Clock>,
    /// The tick and the call timeout (the main Redis's).
    pub(in crate::global) settings: SyncSettings,
}

impl<S> Clone for PresenceLoop<S> {
    fn clone(&self) -> Self {
        PresenceLoop {
            source: self.source.clone(),
            stats: self.stats.clone(),
            stores: self.stores.clone(),
            queues: self.queues.clone(),
            fleet: self.fleet.clone(),
            clock: self.clock.clone(),
            settings: self.settings,
        }
    }
}

/// What the loop remembers between ticks, per shard.
struct Shards {
    /// The counters it published streams on and has not removed since, with when that
    /// publication expires (Unix ms): past it, the store dropped them already, so they are
    /// forgotten here too (which bounds this by what the engine named within a TTL).
    published: Vec<HashMap<u128, u64>>,
    /// Whether its last call failed (so a failure is logged once until it answers).
    failing: Vec<bool>,
}

/// One shard's call of a tick: the items, and how many of the first are the source's (the
/// rest are removals).
struct Batch {
    shard: usize,
    items: Vec<Presence>,
    asked: usize,
}

impl<S: ShardStore> PresenceLoop<S> {
    /// Runs a round at once and one every tick until `stop`; then removes this replica's
    /// entries (one call per shard, within the timeout).
    pub(in crate::global) async fn run(self, stop: CancellationToken) {
        let tick = Duration::from_millis(self.settings.policy.tick_ms.max(1));
        let mut shards = Shards {
            published: vec![HashMap::new(); self.stores.len()],
            failing: vec![false; self.stores.len()],
        };
        let mut next = tokio::time::Instant::now();
        loop {
            // `biased`: an unbiased `select!` draws from the runtime's random numbers, which
            // the simulator's other tasks draw from too; this loop must not move them.
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
            }
            let local = self.source.local();
            self.round(local, &mut shards).await;
            next += tick;
            next = next.max(tokio::time::Instant::now());
        }
        // Leaving: every entry removed, so the others' Envoys get the room at once.
        self.round(Vec::new(), &mut shards).await;
    }

    /// One round: `local` published (and what it no longer holds removed), one call per
    /// shard with items, all at once; each reply handed to the source as it comes.
    async fn round(&self, local: Vec<Presence>, shards: &mut Shards) {
        let now_ms = self.clock.now().0;
        let ttl = ttl_ms(self.settings.policy.tick_ms);
        for published in &mut shards.published {
            published.retain(|_, expires| *expires > now_ms);
        }
        let batches = self.batches(local, &shards.published);
        // Published from the moment it is sent: a call that timed out may have run, so
        // only a removal that answered forgets a counter.
        for b in &batches {
            let published = &mut shards.published[b.shard];
            let sent = b.items.iter().filter(|it| it.streams > 0);
            published.extend(sent.map(|it| (it.entity, now_ms + ttl)));
        }
        let mut calls: FuturesUnordered<_> = batches
            .into_iter()
            .map(|b| async move {
                let result = self.call(&b, now_ms, ttl).await;
                (b, result)
            })
            .collect();
        while let Some((b, result)) = calls.next().await {
            self.take_reply(shards, b, result);
        }
    }

    /// One shard's store call, within the timeout.
    async fn call(&self, b: &Batch, now_ms: u64, ttl: u64) -> Result<Vec<Others>, StoreError> {
        let store = &self.stores[b.shard];
        let trip = Trip {
            publish: Some(Publish {
                items: &b.items,
                now_ms,
                ttl_ms: ttl,
            }),
            ..Trip::default()
        };
        let call = async {
            let answer = store.round_trip(self.fleet.replica_id(), trip).await?;
            Ok::<_, StoreError>(answer.others)
        };
        match tokio::time::timeout(self.settings.timeout, call).await {
            Ok(Ok(o)) if o.len() == b.items.len() => Ok(o),
            Ok(Ok(o)) => Err(StoreError::reply(format!(
                "store answered {} presences for {} items",
                o.len(),
                b.items.len()
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout(self.settings.timeout)),
        }
    }

    /// Takes one shard's answer: the others' sums to the source (for the counters it
    /// named), the removals that answered forgotten; or the failure counted and logged once.
    fn take_reply(&self, shards: &mut Shards, b: Batch, result: Result<Vec<Others>, StoreError>) {
        let stats = &self.stats;
        let name = self.stores[b.shard].name();
        stats
            .items_sent
            .fetch_add(b.items.len() as u64, Ordering::Relaxed);
        let failing = &mut shards.failing[b.shard];
        match result {
            Ok(others) => {
                stats.calls_ok.fetch_add(1, Ordering::Relaxed);
                if std::mem::take(failing) {
                    tracing::info!(shard = %name, "RLQS presence answering again");
                }
                let published = &mut shards.published[b.shard];
                for it in b.items.iter().filter(|it| it.streams == 0) {
                    published.remove(&it.entity);
                }
                let named = &b.items[..b.asked];
                let mine: Vec<(u128, Others)> =
                    named.iter().map(|it| it.entity).zip(others).collect();
                if !mine.is_empty() {
                    self.source.others(&mine);
                }
            }
            Err(e) => {
                stats.calls_failed.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(failing, true) {
                    tracing::warn!(shard = %name, error = %e, "RLQS presence call failed; keeping the fleet's last streams until the shard answers");
                } else {
                    tracing::debug!(shard = %name, error = %e, "RLQS presence call failed again");
                }
            }
        }
    }

    /// The calls of a round: `local` by shard (a counter named twice summed), then on each
    /// shard a removal for every counter published there that `local` no longer names.
    fn batches(&self, local: Vec<Presence>, published: &[HashMap<u128, u64>]) -> Vec<Batch> {
        if self.stores.is_empty() {
            return Vec::new();
        }
        let mut by_shard: Vec<Vec<Presence>> = vec![Vec::new(); self.stores.len()];
        let mut seen: HashMap<u128, (usize, usize)> = HashMap::with_capacity(local.len());
        for p in local {
            if let Some(&(s, i)) = seen.get(&p.entity) {
                let it = &mut by_shard[s][i];
                it.streams = it.streams.saturating_add(p.streams);
                it.demand = sum_demand(it.demand, p.demand);
                continue;
            }
            let s = self
                .queues
                .shard_of(p.entity, false)
                .min(self.stores.len() - 1);
            seen.insert(p.entity, (s, by_shard[s].len()));
            by_shard[s].push(p);
        }
        by_shard
            .into_iter()
            .enumerate()
            .filter_map(|(shard, mut items)| {
                let asked = items.len();
                let gone = published[shard].keys().filter(|e| !seen.contains_key(e));
                items.extend(gone.map(|&entity| Presence {
                    entity,
                    streams: 0,
                    demand: 0.0,
                }));
                (!items.is_empty()).then_some(Batch {
                    shard,
                    items,
                    asked,
                })
            })
            .collect()
    }
}

/// Two demands of one counter summed, each read as the store reads it (NaN or negative: 0;
/// the store caps the sum, `Presence::demand_milli`).
fn sum_demand(a: f64, b: f64) -> f64 {
    // `f64::max` takes the number when one side is NaN.
    a.max(0.0) + b.max(0.0)
}
