//! The in-memory store's exact rules' side: [`MemoryStore`]'s exact counters and token
//! buckets (apart from the sync's, as in Redis) behind [`ExactStore`], worked out by the same
//! [`apply`] as the Lua script's twin. Apart from `mod.rs`, the sync's side, as in Redis
//! (`global/redis/exact.rs` beside `sync.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::MemoryStore;
use crate::global::exact::{
    apply, ExactCounters, ExactFuture, ExactItem, ExactStore, LogFuture, ResetFuture, ResetItem,
    ResetKind,
};
use crate::global::sync::store::StoreError;

impl ExactStore for MemoryStore {
    fn exact<'a>(&'a self, items: &'a [ExactItem], commit: bool) -> ExactFuture<'a> {
        Box::pin(async move {
            self.exact_calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::connection("connection refused"));
            }
            let mut windows = self.exact.lock();
            let mut buckets = self.exact_buckets.lock();
            let mut maps = ExactMaps {
                windows: &mut windows,
                buckets: &mut buckets,
            };
            Ok(apply(items, commit, &mut maps))
        })
    }

    /// As `reset.lua`: the sync's counters by `MemoryStore::reset_window` and
    /// `reset_bucket`, the exact keys removed.
    fn reset<'a>(&'a self, items: &'a [ResetItem]) -> ResetFuture<'a> {
        Box::pin(async move {
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::connection("connection refused"));
            }
            let out = items
                .iter()
                .map(|it| {
                    let (e, l) = (it.entity, it.limit);
                    match it.kind {
                        ResetKind::Window { epochs } => self.reset_window(e, l, epochs),
                        ResetKind::Bucket => {
                            self.reset_bucket(e, l);
                            [0, 0]
                        }
                        ResetKind::ExactWindow { epochs } => {
                            let mut w = self.exact.lock();
                            epochs.map(|ep| w.remove(&(e, l, ep)).unwrap_or(0))
                        }
                        ResetKind::ExactBucket => {
                            self.exact_buckets.lock().remove(&(e, l));
                            [0, 0]
                        }
                    }
                })
                .collect();
            Ok(out)
        })
    }

    /// As `reset_append.lua`: `ResetLog::append`.
    fn log_resets<'a>(&'a self, entities: &'a [u128], max_len: usize) -> LogFuture<'a> {
        Box::pin(async move {
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::connection("connection refused"));
            }
            Ok(self.reset_log.lock().append(entities, max_len))
        })
    }
}

/// The exact maps under their locks, as [`apply`] reads and writes them.
struct ExactMaps<'a> {
    windows: &'a mut HashMap<(u128, u8, u64), u64>,
    buckets: &'a mut HashMap<(u128, u8), u64>,
}

impl ExactCounters for ExactMaps<'_> {
    fn read(&mut self, entity: u128, limit: u8, epoch: u64) -> u64 {
        self.windows
            .get(&(entity, limit, epoch))
            .copied()
            .unwrap_or(0)
    }
    fn add(&mut self, entity: u128, limit: u8, epoch: u64, delta: i64) {
        let v = self.windows.entry((entity, limit, epoch)).or_default();
        *v = (*v as i64 + delta).max(0) as u64;
    }
    fn tat(&mut self, entity: u128, limit: u8) -> u64 {
        self.buckets.get(&(entity, limit)).copied().unwrap_or(0)
    }
    fn set_tat(&mut self, entity: u128, limit: u8, tat_ns: u64) {
        // As the script: a full bucket's key is deleted (an absent key reads as full). Keys
        // never expire here; a stale `tat` reads as full as well.
        if tat_ns == 0 {
            self.buckets.remove(&(entity, limit));
        } else {
            self.buckets.insert((entity, limit), tat_ns);
        }
    }
}
