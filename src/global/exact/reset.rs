//! An operator's reset of counters (`POST /reset`, `rls/reset.rs`): what one call clears
//! ([`ResetItem`]) and [`ExactClient::reset`], which sends each entity's items to its shard.
//!
//! The reset goes through the exact rules' client because it already holds what a reset
//! needs and the sync's stores do not offer: a pool per shard of its own, routed as the sync
//! routes entities (per-second rules to the per-second Redis), behind an object-safe trait.
//!
//! What a store does (`global/redis/reset.rs` on Redis, `MemoryStore` in memory): the sync's
//! window counters keep every replica's part, and each sync states a part whole and the
//! store keeps the larger, so deleting the key would be undone by the replicas' next
//! statements (and their floors). Instead the store adds to the counter one more part of
//! its own, minus the count it held: the sum is 0, every replica's statement leaves it
//! there (a part stated again changes nothing; only hits made since add to it), and the
//! sync script reads that part as refunds the store applied, so a replica's floor (the
//! count it last read, `store.rs`) is lowered by as much and cannot bring the count back.
//! The fleet's token buckets are set full. Exact rules' keys are deleted: Redis alone
//! counts them.
//!
//! Then each shard's reset log gets an entry per entity reset there, after its counters
//! were cleared: every replica's heartbeat reads the log each tick and clears its view of
//! those entities, so a replica with no request for them learns of the reset all the same
//! (`global/sync/reset_log.rs`). A log that could not be written fails the reset (503): the
//! counters are cleared, and a retry clears them again and logs them.

use std::sync::atomic::Ordering;

use super::{ExactClient, ExactStore};
use crate::global::sync::store::StoreError;

/// A reset may take this many Redis timeouts: it makes a call per entity, one after
/// another on a shard (up to `MAX_DESCRIPTORS` of them), and nobody's request waits on it.
pub const RESET_TIMEOUTS: u32 = 10;

/// One limit of one entity to reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetItem {
    /// The entity.
    pub entity: u128,
    /// Which limit of the entity's rule.
    pub limit: u8,
    /// Which counters.
    pub kind: ResetKind,
    /// Its rule's limits are all per second: with `REDIS_PERSECOND` its counters are in the
    /// per-second Redis.
    pub per_second: bool,
}

/// Which counters of a limit a reset clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    /// The sync's window counters of the current and previous epoch.
    Window {
        /// The current and the previous epoch.
        epochs: [u64; 2],
    },
    /// The sync's token bucket.
    Bucket,
    /// An exact rule's window counters of the current and previous epoch.
    ExactWindow {
        /// The current and the previous epoch.
        epochs: [u64; 2],
    },
    /// An exact rule's token bucket.
    ExactBucket,
}

/// A store's reset reply: per item, in order, the counts it held before (current, previous
/// epoch; a bucket's `[0, 0]`).
pub type ResetReply = Vec<[u64; 2]>;

impl ExactClient {
    /// Keeps at most `len` entries (at least 1) in each shard's reset log
    /// (`RESET_LOG_LENGTH`).
    pub fn with_reset_log_length(mut self, len: usize) -> Self {
        self.reset_log_length = len.max(1);
        self
    }

    /// Resets `items`, one store call per shard, at once, within [`RESET_TIMEOUTS`] times
    /// the timeout. Returns the counts before, per item in order.
    ///
    /// # Errors
    /// A call failed or timed out (what the others cleared stays cleared).
    pub async fn reset(&self, items: &[ResetItem]) -> Result<ResetReply, StoreError> {
        if self.stores.is_empty() {
            return Err(StoreError::other("no store"));
        }
        let mut by_store: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let s = self
                .router
                .shard_of(it.entity, it.per_second)
                .min(self.stores.len() - 1);
            match by_store.iter_mut().find(|(store, _)| *store == s) {
                Some((_, idx)) => idx.push(i),
                None => by_store.push((s, vec![i])),
            }
        }
        let max_len = self.reset_log_length;
        let calls = by_store.iter().map(|(s, idx)| {
            let sub: Vec<ResetItem> = idx.iter().map(|&i| items[i]).collect();
            let mut entities: Vec<u128> = Vec::new();
            for it in &sub {
                if !entities.contains(&it.entity) {
                    entities.push(it.entity);
                }
            }
            let store: &dyn ExactStore = &*self.stores[*s];
            async move {
                let before = store.reset(&sub).await?;
                store.log_resets(&entities, max_len).await?;
                Ok::<_, StoreError>(before)
            }
        });
        let run = futures_util::future::try_join_all(calls);
        let limit = self.timeout * RESET_TIMEOUTS;
        let replies = match tokio::time::timeout(limit, run).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(limit)),
        };
        let replies = replies.inspect_err(|_| {
            self.stats.calls_failed.fetch_add(1, Ordering::Relaxed);
        })?;
        let mut out = vec![[0; 2]; items.len()];
        for ((_, idx), reply) in by_store.iter().zip(replies) {
            for (&i, c) in idx.iter().zip(reply) {
                out[i] = c;
            }
        }
        Ok(out)
    }
}
