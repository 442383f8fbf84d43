//! An in-memory [`ShardStore`]: per-epoch counters in a map, as Redis holds them, and the
//! replicas' heartbeats (id → last seen). The sync tests and the fleet simulator run the
//! production sync code against it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::store::{Heartbeat, ShardStore, StoreError, SyncItem};

/// An in-memory store of counters keyed by (entity, limit, epoch); `down` makes every call
/// fail.
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub counters: Mutex<HashMap<(u128, u8, u64), i64>>,
    pub calls: AtomicU64,
    pub down: AtomicBool,
    /// Live replicas: id → last seen (Unix ms).
    pub replicas: Mutex<HashMap<u64, u64>>,
}

impl ShardStore for MemoryStore {
    fn name(&self) -> &str {
        "memory"
    }
    async fn sync(&self, items: &[SyncItem]) -> Result<Vec<[u64; 2]>, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::Backend("connection refused".into()));
        }
        let mut c = self.counters.lock();
        Ok(items
            .iter()
            .map(|it| {
                let mut out = [0; 2];
                for (i, o) in out.iter_mut().enumerate() {
                    let v = c.entry((it.entity, it.limit, it.epochs[i])).or_default();
                    *v += it.deltas[i];
                    *o = (*v).max(0) as u64;
                }
                out
            })
            .collect())
    }
    async fn heartbeat(&self, beat: &Heartbeat) -> Result<u32, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::Backend("connection refused".into()));
        }
        let mut r = self.replicas.lock();
        if beat.leaving {
            r.remove(&beat.replica);
        } else {
            r.insert(beat.replica, beat.now_ms);
        }
        let oldest = beat.now_ms.saturating_sub(beat.ttl_ms);
        r.retain(|_, seen| *seen >= oldest);
        Ok(r.len() as u32)
    }
    /// As Redis sends them: one script call per 500 items.
    fn commands_for(&self, items: usize) -> usize {
        items.div_ceil(500)
    }
    async fn time_ms(&self) -> Result<u64, StoreError> {
        Ok(1_700_000_005_000)
    }
}
