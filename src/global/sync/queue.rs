//! Where the hot path hands entities to the sync: per-shard queues of entities with news and
//! their wake-ups, the rendezvous-hash router that picks an entity's shard, and the sync
//! counters. A cold entity queued wakes its shard's task for an early round trip, and a young
//! one in a burst for burst reads (`core/window/prior.rs`). What the heartbeats say of the
//! fleet is `fleet.rs`'s; the table whose entities are queued is handed to the shard tasks
//! beside the queues (`global::spawn`), not held here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::core::table::EntityState;

/// Assigns entities to shards by rendezvous hashing: each entity goes to the shard whose
/// (shard name, entity) hash is highest, so adding a shard moves only the ~1/N of entities
/// that now score highest on it, whatever the order of the list.
///
/// With a per-second Redis (`REDIS_PERSECOND`) the shards are two groups, the main one's
/// first: an entity whose rule's limits are all per second hashes among the second group,
/// every other among the first.
#[derive(Debug, Clone)]
pub struct ShardRouter {
    seeds: Vec<u64>,
    /// Where the per-second group starts (`seeds.len()` when there is none).
    split: usize,
}

impl ShardRouter {
    /// A router over shards with these (stable) names.
    pub fn new(names: &[String]) -> Self {
        Self::with_per_second(names, &[])
    }

    /// A router over the `main` shards and, for per-second entities, the `per_second` ones
    /// (indices after the main ones'). An empty `per_second` sends every entity to `main`.
    pub fn with_per_second(main: &[String], per_second: &[String]) -> Self {
        let seed = |n: &String| xxhash_rust::xxh3::xxh3_64(n.as_bytes());
        ShardRouter {
            seeds: main.iter().chain(per_second).map(seed).collect(),
            split: main.len(),
        }
    }

    /// The shard of `entity` (a main-group entity).
    pub fn shard(&self, entity: u128) -> usize {
        self.shard_of(entity, false)
    }

    /// The shard of `entity`, in the per-second group when `per_second` and there is one.
    pub fn shard_of(&self, entity: u128, per_second: bool) -> usize {
        let group = if per_second && self.split < self.seeds.len() {
            self.split..self.seeds.len()
        } else {
            0..self.split
        };
        if group.len() <= 1 {
            return group.start;
        }
        let bytes = entity.to_le_bytes();
        group
            .max_by_key(|&i| xxh3_64_with_seed(&bytes, self.seeds[i]))
            .unwrap_or(0)
    }
}

/// Counters of the sync machinery, read by the metrics.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Ticks run, over all shards.
    pub ticks: AtomicU64,
    /// Store calls that succeeded.
    pub calls_ok: AtomicU64,
    /// Store calls that failed.
    pub calls_failed: AtomicU64,
    /// Store calls that timed out for their size and were sent again smaller
    /// (`sync/batch.rs`): neither failed nor ok.
    pub calls_resized: AtomicU64,
    /// Items (entity limits) sent.
    pub items_sent: AtomicU64,
    /// Hits that could not be kept for sync (queue bound hit, or lost at a failed final flush).
    pub deltas_dropped: AtomicU64,
    /// Entities synced, by tier at the time of the sync: idle, low, normal, hot.
    pub synced_by_tier: [AtomicU64; 4],
    /// Entities whose tier changed between two syncs.
    pub tier_transitions: AtomicU64,
    /// Sum of |estimate after a reply − estimate before it|, in hits (drift of the local view).
    pub drift_hits: AtomicU64,
    /// Commands sent to the store.
    pub commands_sent: AtomicU64,
    /// Total time of store calls, in microseconds (with the calls of every result, the mean).
    pub call_micros: AtomicU64,
    /// Background tasks (shard sync, clock offset) that panicked or ended before shutdown.
    pub task_failures: AtomicU64,
}

/// The per-shard queues of entities with news.
#[derive(Debug)]
pub struct SyncQueues {
    queues: Vec<Mutex<VecDeque<u128>>>,
    router: ShardRouter,
    queued: AtomicUsize,
    max_queued: usize,
    /// Sync counters.
    pub stats: Arc<SyncStats>,
    /// Per shard: a cold entity was queued (an early round trip is wanted).
    wake: Vec<Notify>,
    /// Per shard: a young entity wants a burst read (`core/window/prior.rs`).
    burst: Vec<Notify>,
    /// Per shard: a young entity has hits to send before the next tick (`core/window/prior.rs`).
    send: Vec<Notify>,
}

impl SyncQueues {
    /// Queues for `router`'s shards, holding at most `max_queued` entities in all.
    pub fn new(router: ShardRouter, shards: usize, max_queued: usize) -> Self {
        SyncQueues {
            queues: (0..shards).map(|_| Mutex::new(VecDeque::new())).collect(),
            router,
            queued: AtomicUsize::new(0),
            max_queued,
            stats: Arc::default(),
            wake: (0..shards).map(|_| Notify::new()).collect(),
            burst: (0..shards).map(|_| Notify::new()).collect(),
            send: (0..shards).map(|_| Notify::new()).collect(),
        }
    }

    /// Resolves when a cold entity was queued on `shard` since the last call (a wake-up
    /// before anyone waits is kept).
    pub(in crate::global) async fn woken(&self, shard: usize) {
        self.wake[shard].notified().await;
    }

    /// Resolves when a young entity of `shard` wanted its hits sent since the last call.
    pub(in crate::global) async fn send_woken(&self, shard: usize) {
        self.send[shard].notified().await;
    }

    /// Resolves when a young entity of `shard` wanted a burst read since the last call.
    pub(in crate::global) async fn burst_woken(&self, shard: usize) {
        self.burst[shard].notified().await;
    }

    /// The shard of `key`, as [`SyncQueues::mark_dirty`] routes it: in the per-second group
    /// when `per_second` and there is one.
    pub fn shard_of(&self, key: u128, per_second: bool) -> usize {
        self.router.shard_of(key, per_second)
    }

    /// A young entity (queued: it stays so until settled) has hits to send before the next
    /// tick: its replica denies it, or its unsent hits are a quarter of its prior
    /// (`core/window/prior.rs`). Wakes its shard's task for a send trip, an early round trip of
    /// which a shard makes up to `MAX_SEND_TRIPS` between two ticks (`global/sync/shard.rs`),
    /// apart from the one a cold entity wakes.
    pub fn want_early_trip(&self, key: u128, per_second: bool) {
        self.send[self.router.shard_of(key, per_second)].notify_one();
    }

    /// A young entity (queued: it stays so until settled) wants its count re-read before
    /// the next tick: wakes its shard's task for a burst read.
    pub fn want_burst_read(&self, key: u128, per_second: bool) {
        self.burst[self.router.shard_of(key, per_second)].notify_one();
    }

    /// Queues the entity `key` (whose shard's lock the caller holds, `state` its state)
    /// unless it already is, on its shard: in the per-second group when `per_second` (its
    /// rule's limits are all per second, `Rule::per_second`) and there is one. When the bound
    /// is hit the entity stays local only, and its pending hits are counted as dropped.
    pub fn mark_dirty(&self, key: u128, state: &mut EntityState, per_second: bool) {
        if state.queued {
            return;
        }
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.max_queued {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let lost: i64 = state.states.iter().map(|w| w.pending().max(0)).sum();
            self.stats
                .deltas_dropped
                .fetch_add(lost as u64, Ordering::Relaxed);
            return;
        }
        state.queued = true;
        let shard = self.router.shard_of(key, per_second);
        self.queues[shard].lock().push_back(key);
        if state.states.iter().any(|w| !w.ever_synced()) {
            // Cold: its first read should not wait for the tick.
            self.wake[shard].notify_one();
        }
    }

    /// The shards queued for (the per-second group's after the main group's).
    pub fn shards(&self) -> usize {
        self.queues.len()
    }

    /// Entities waiting in all queues (in flight ones included).
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard's whole queue, oldest first.
    pub(in crate::global) fn take(&self, shard: usize) -> VecDeque<u128> {
        std::mem::take(&mut *self.queues[shard].lock())
    }

    /// Queues `entities` again, after those queued meanwhile.
    pub(in crate::global) fn requeue(&self, shard: usize, entities: Vec<u128>) {
        if !entities.is_empty() {
            self.queues[shard].lock().extend(entities);
        }
    }

    /// Queues `entities` again ahead of those queued meanwhile: the part of a queue taken
    /// that a call had no room for, which keeps its place. Costs what was queued meanwhile,
    /// not what is put back, so a backlog of a million drained a call at a time is not
    /// copied per call.
    pub(in crate::global) fn requeue_first(&self, shard: usize, mut entities: VecDeque<u128>) {
        if entities.is_empty() {
            return;
        }
        let mut queue = self.queues[shard].lock();
        entities.append(&mut queue);
        *queue = entities;
    }

    pub(in crate::global) fn release(&self, state: &mut EntityState) {
        state.queued = false;
        self.forget_one();
    }

    /// Counts out a queued entity that is gone.
    pub(in crate::global) fn forget_one(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_shard_moves_about_one_in_n_entities() {
        let names = |n: usize| {
            (0..n)
                .map(|i| format!("redis://10.0.0.{i}:6379"))
                .collect::<Vec<_>>()
        };
        let (three, four) = (ShardRouter::new(&names(3)), ShardRouter::new(&names(4)));
        let total = 20_000u128;
        let mut moved = 0;
        let mut per_shard = [0usize; 4];
        for e in 0..total {
            let key = e.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
            let (a, b) = (three.shard(key), four.shard(key));
            per_shard[b] += 1;
            if a != b {
                moved += 1;
                assert_eq!(b, 3, "an entity only ever moves to the new shard");
            }
        }
        let share = moved as f64 / total as f64;
        assert!((0.22..0.28).contains(&share), "moved {share}");
        assert!(per_shard.iter().all(|&n| n > 4_000), "{per_shard:?}");
    }

    #[test]
    fn per_second_entities_stay_in_their_group_and_the_main_group_does_not_move() {
        let names = |prefix: &str, n: usize| {
            (0..n)
                .map(|i| format!("redis://{prefix}{i}:6379"))
                .collect::<Vec<_>>()
        };
        let alone = ShardRouter::new(&names("m", 2));
        let split = ShardRouter::with_per_second(&names("m", 2), &names("s", 2));
        let mut seen = [0usize; 4];
        for e in 0..2_000u128 {
            let key = e.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
            // Main entities hash as they did without a per-second group.
            assert_eq!(split.shard_of(key, false), alone.shard(key));
            let s = split.shard_of(key, true);
            assert!((2..4).contains(&s), "{s}");
            seen[s] += 1;
            seen[split.shard(key)] += 1;
            // No per-second group: per-second entities go where the others do.
            assert_eq!(alone.shard_of(key, true), alone.shard(key));
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }
}
