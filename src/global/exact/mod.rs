//! Exact rules' store calls (docs/global.md, "Exact rules"): the narrow [`ExactStore`] trait (one
//! atomic check-and-count call for a group of keys), and [`ExactClient`], which splits a
//! request's exact items into one call per shard (per entity on a Redis Cluster), runs them
//! at once under the Redis timeout, and keeps all-or-nothing across the calls by giving back
//! what a call counted when another one refused or failed.
//!
//! Redis implements the trait in `global/redis/exact.rs`, the in-memory store in
//! `global/memory/exact.rs`; a token
//! bucket item's own steps are in `bucket.rs`.

pub mod bucket;
pub mod reset;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::window::Prev;
use crate::core::{Algorithm, Limit};
use crate::global::sync::queue::ShardRouter;
use crate::global::sync::store::StoreError;
pub use bucket::ExactBucket;
pub use reset::{ResetItem, ResetKind, ResetReply};

/// One limit of one entity in an exact call: check `hits` against the limit on the store's
/// exact counters of `epoch` (and `epoch - 1` for the sliding window and concurrency) and
/// count them if every item of the call fits; or, with `refund`, give `hits` back to `epoch`
/// unconditionally (to `epoch - 1` first for concurrency, as `core/window/` does).
/// With `bucket` set, the limit is a token bucket instead (`bucket.rs`): the epoch
/// fields are unused and the store's bucket is checked and spent, or refunded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactItem {
    /// The entity.
    pub entity: u128,
    /// Which limit of the entity's rule.
    pub limit: u8,
    /// The current epoch (`now / window_ms`).
    pub epoch: u64,
    /// The window.
    pub window_ms: u64,
    /// Milliseconds left in the current epoch (`window_ms - now % window_ms`), for the weight
    /// of the previous epoch.
    pub left_ms: u64,
    /// How the previous epoch counts: not (fixed), weighted (sliding) or whole
    /// (concurrency). A bucket's is [`Prev::Out`].
    pub prev: Prev,
    /// The limit.
    pub requests_per_unit: u32,
    /// Hits to check and count (or give back). At most 2^32: more is over any limit anyway,
    /// and keeps the number exact in Lua.
    pub hits: u64,
    /// Expiry of a counter the call creates: two windows.
    pub ttl_ms: u64,
    /// Give `hits` back (`is_negative_hits`) instead of checking and counting them.
    pub refund: bool,
    /// A token bucket: its capacity and the request's time (`None`: a window).
    pub bucket: Option<ExactBucket>,
    /// Its rule's limits are all per second (`Rule::per_second`): with `REDIS_PERSECOND`
    /// it goes to the per-second Redis, as the rule's sync does.
    pub per_second: bool,
}

impl ExactItem {
    /// The limit the item checks (a bucket's, or a window's by its `prev`).
    pub fn limit(&self) -> Limit {
        Limit {
            requests_per_unit: self.requests_per_unit,
            window_ms: self.window_ms,
            algorithm: match (self.bucket, self.prev) {
                (Some(b), _) => Algorithm::TokenBucket { burst: b.burst },
                (None, Prev::Decays) => Algorithm::SlidingWindow,
                (None, Prev::Whole) => Algorithm::Concurrency,
                (None, Prev::Out) => Algorithm::FixedWindow,
            },
        }
    }
}

/// What the store holds for one item, before the call counted anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExactCount {
    /// The previous epoch's count (0 for a fixed window).
    pub prev: u64,
    /// The current epoch's count.
    pub curr: u64,
    /// Whether the item's hits go over its limit.
    pub over: bool,
    /// A bucket: how far its `tat` was ahead of the request's time (ns; 0: full). 0 for a
    /// window.
    pub owed_ns: u64,
}

/// The answer to an exact call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExactReply {
    /// Every checked item fits (and, when the call was to commit, all were counted).
    pub fits: bool,
    /// One per item, in order.
    pub counts: Vec<ExactCount>,
}

/// A boxed store future: the exact path is taken per request, so the trait is used as an
/// object ([`ExactClient`] holds any store), unlike [`crate::global::ShardStore`].
pub type ExactFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ExactReply, StoreError>> + Send + 'a>>;

/// A boxed reset future ([`ExactStore::reset`]).
pub type ResetFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ResetReply, StoreError>> + Send + 'a>>;

/// A boxed reset log future ([`ExactStore::log_resets`]): the newest entry's number.
pub type LogFuture<'a> = Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send + 'a>>;

/// A store that checks and counts exact items atomically.
pub trait ExactStore: Send + Sync + 'static {
    /// In one atomic step: reads every item's counters; if every non-refund item fits and
    /// `commit` is set, counts them all; applies every refund; returns the counts read.
    fn exact<'a>(&'a self, items: &'a [ExactItem], commit: bool) -> ExactFuture<'a>;
    /// Items whose groups differ cannot go in one call (a Redis Cluster: different slots).
    fn group(&self, _entity: u128) -> u128 {
        0
    }
    /// Resets `items` (an operator's reset, `reset.rs`) and returns, per item, the counts
    /// held before. This default refuses: a store of the benches' and tests' fakes.
    fn reset<'a>(&'a self, items: &'a [ResetItem]) -> ResetFuture<'a> {
        let _ = items;
        Box::pin(async { Err(StoreError::other("this store cannot reset")) })
    }
    /// Appends an entry per entity to the shard's reset log, keeping its newest `max_len`
    /// (`global/sync/reset_log.rs`). This default keeps no log: a store of the fakes, whose
    /// replicas learn of a reset at their next sync.
    fn log_resets<'a>(&'a self, entities: &'a [u128], max_len: usize) -> LogFuture<'a> {
        let _ = (entities, max_len);
        Box::pin(async { Ok(0) })
    }
}

/// Counters of the exact path, read by the metrics.
#[derive(Debug, Default)]
pub struct ExactStats {
    /// Exact store calls that answered.
    pub calls_ok: AtomicU64,
    /// Exact store calls that failed or timed out.
    pub calls_failed: AtomicU64,
    /// Exact descriptors decided by the prior because the store failed.
    pub fallbacks: AtomicU64,
    /// Exact requests answered from memory (a key known to be over), with no store call.
    pub from_memory: AtomicU64,
    /// Calls that gave back what they had counted, another call of the request having
    /// refused or failed.
    pub given_back: AtomicU64,
    /// When a fallback was last logged (Unix ms), to log at most one line per interval.
    pub last_log_ms: AtomicU64,
}

/// The exact path's way to the stores: routing, timeout, all-or-nothing across calls.
pub struct ExactClient {
    stores: Vec<Arc<dyn ExactStore>>,
    router: ShardRouter,
    timeout: Duration,
    /// The most entries a shard's reset log keeps (`RESET_LOG_LENGTH`, `reset.rs`).
    reset_log_length: usize,
    /// Counters for the metrics.
    pub stats: Arc<ExactStats>,
}

impl std::fmt::Debug for ExactClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactClient")
            .field("stores", &self.stores.len())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ExactClient {
    /// A client over `stores` (the shards, routed as the sync routes them), each call bounded
    /// by `timeout`.
    pub fn new(stores: Vec<Arc<dyn ExactStore>>, router: ShardRouter, timeout: Duration) -> Self {
        ExactClient {
            stores,
            router,
            timeout,
            reset_log_length: crate::global::sync::reset_log::DEFAULT_RESET_LOG_LENGTH,
            stats: Arc::default(),
        }
    }

    /// Checks `items` and, with `commit`, counts them all or none: one call per store group,
    /// at once. When one call refuses (an item over) or fails, the calls that counted give it
    /// back with a second call, so other requests may see those hits for a round trip (a
    /// false denial, never an over-admission); if that fails too, the hits stay counted.
    ///
    /// # Errors
    /// A call failed or the whole took longer than the timeout.
    pub async fn check_and_count(
        &self,
        items: &[ExactItem],
        commit: bool,
    ) -> Result<ExactReply, StoreError> {
        if self.stores.is_empty() {
            return Err(StoreError::other("no exact store"));
        }
        let groups = self.groups(items);
        let run = async {
            let calls = groups.iter().map(|(store, idx)| {
                let sub: Vec<ExactItem> = idx.iter().map(|&i| items[i]).collect();
                let store = &self.stores[*store];
                async move { store.exact(&sub, commit).await }
            });
            let replies = futures_util::future::join_all(calls).await;
            self.settle(items, &groups, replies, commit).await
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(r) => r,
            Err(_) => {
                self.stats.calls_failed.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Timeout(self.timeout))
            }
        }
    }

    /// Item indices by (store, group), in first-seen order.
    fn groups(&self, items: &[ExactItem]) -> Vec<(usize, Vec<usize>)> {
        let mut groups: Vec<(usize, u128, Vec<usize>)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let store = self
                .router
                .shard_of(it.entity, it.per_second)
                .min(self.stores.len() - 1);
            let group = self.stores[store].group(it.entity);
            match groups
                .iter_mut()
                .find(|(s, g, _)| *s == store && *g == group)
            {
                Some((_, _, idx)) => idx.push(i),
                None => groups.push((store, group, vec![i])),
            }
        }
        groups.into_iter().map(|(s, _, idx)| (s, idx)).collect()
    }

    /// Merges the calls' replies in item order; gives back what was counted when the request
    /// as a whole does not fit or a call failed.
    async fn settle(
        &self,
        items: &[ExactItem],
        groups: &[(usize, Vec<usize>)],
        replies: Vec<Result<ExactReply, StoreError>>,
        commit: bool,
    ) -> Result<ExactReply, StoreError> {
        let mut out = ExactReply {
            fits: true,
            counts: vec![ExactCount::default(); items.len()],
        };
        let mut error = None;
        for ((_, idx), reply) in groups.iter().zip(&replies) {
            match reply {
                Ok(r) => {
                    self.stats.calls_ok.fetch_add(1, Ordering::Relaxed);
                    out.fits &= r.fits;
                    for (&i, c) in idx.iter().zip(&r.counts) {
                        out.counts[i] = *c;
                    }
                }
                Err(e) => {
                    self.stats.calls_failed.fetch_add(1, Ordering::Relaxed);
                    error = Some(e.clone());
                }
            }
        }
        let whole = out.fits && error.is_none();
        if commit && !whole && groups.len() > 1 {
            self.give_back(items, groups, &replies).await;
        }
        match error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Refunds the hits of the calls that counted theirs.
    async fn give_back(
        &self,
        items: &[ExactItem],
        groups: &[(usize, Vec<usize>)],
        replies: &[Result<ExactReply, StoreError>],
    ) {
        let calls = groups.iter().zip(replies).filter_map(|((store, idx), r)| {
            if !r.as_ref().is_ok_and(|r| r.fits) {
                return None;
            }
            let back: Vec<ExactItem> = idx
                .iter()
                .map(|&i| items[i])
                .filter(|it| !it.refund && it.hits > 0)
                .map(|it| ExactItem { refund: true, ..it })
                .collect();
            let store = &self.stores[*store];
            Some(async move { store.exact(&back, true).await })
        });
        for r in futures_util::future::join_all(calls).await {
            self.stats.given_back.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = r {
                tracing::debug!(error = %e, "could not give back exact hits; they stay counted");
            }
        }
    }
}

/// What a refund item takes off the window counts `c` read: `[previous, current]`, never
/// below 0; a concurrency limit's release from the previous epoch first (`core/window/`).
pub fn given_back(it: &ExactItem, c: &ExactCount) -> [u64; 2] {
    crate::core::exact::given_back(it.prev, it.hits, c.prev, c.curr)
}

/// A store's exact counters, for [`apply`]: window counters by (entity, limit, epoch) and
/// buckets' `tat` by (entity, limit).
pub trait ExactCounters {
    /// A window counter (0 when absent).
    fn read(&mut self, entity: u128, limit: u8, epoch: u64) -> u64;
    /// Adds `delta` to a window counter, creating it.
    fn add(&mut self, entity: u128, limit: u8, epoch: u64, delta: i64);
    /// A bucket's `tat` (Unix ns; 0 when absent, which is full).
    fn tat(&mut self, entity: u128, limit: u8) -> u64;
    /// Sets a bucket's `tat` (Unix ns; 0 removes it: full).
    fn set_tat(&mut self, entity: u128, limit: u8, tat_ns: u64);
}

/// The store-independent semantics of an exact call, for stores that hold their counters in
/// maps (`global/memory/`); Redis runs the same steps in Lua (`global/redis/exact.rs`,
/// `exact.lua`). Every read comes before the first write, as in the script.
pub fn apply(items: &[ExactItem], commit: bool, store: &mut impl ExactCounters) -> ExactReply {
    let mut reply = ExactReply {
        fits: true,
        counts: Vec::with_capacity(items.len()),
    };
    for it in items {
        if let Some(b) = it.bucket {
            let owed_ns = store.tat(it.entity, it.limit).saturating_sub(b.now_ns());
            let over = !it.refund && !bucket::fits(it, owed_ns);
            reply.fits &= !over;
            reply.counts.push(ExactCount {
                over,
                owed_ns,
                ..ExactCount::default()
            });
            continue;
        }
        let curr = store.read(it.entity, it.limit, it.epoch);
        let prev = if it.prev != Prev::Out && it.epoch > 0 {
            store.read(it.entity, it.limit, it.epoch - 1)
        } else {
            0
        };
        let mut over = false;
        if !it.refund {
            let weighted = match it.prev {
                Prev::Decays => {
                    (u128::from(prev) * u128::from(it.left_ms) / u128::from(it.window_ms)) as u64
                }
                Prev::Whole => prev,
                Prev::Out => 0,
            };
            let count = weighted + curr + it.hits;
            over = it.requests_per_unit == 0 || count > u64::from(it.requests_per_unit);
        }
        reply.fits &= !over;
        reply.counts.push(ExactCount {
            prev,
            curr,
            over,
            owed_ns: 0,
        });
    }
    for (it, c) in items.iter().zip(&reply.counts) {
        if let Some(b) = it.bucket {
            let after = if it.refund {
                bucket::refunded(it, c.owed_ns)
            } else if commit && reply.fits && it.hits > 0 {
                bucket::spent(it, c.owed_ns)
            } else {
                continue;
            };
            if after != c.owed_ns {
                let tat = if after == 0 { 0 } else { b.now_ns() + after };
                store.set_tat(it.entity, it.limit, tat);
            }
        } else if it.refund {
            let [back_prev, back] = given_back(it, c);
            if back_prev > 0 {
                store.add(it.entity, it.limit, it.epoch - 1, -(back_prev as i64));
            }
            if back > 0 {
                store.add(it.entity, it.limit, it.epoch, -(back as i64));
            }
        } else if commit && reply.fits && it.hits > 0 {
            store.add(it.entity, it.limit, it.epoch, it.hits as i64);
        }
    }
    reply
}
