//! An in-memory [`ShardStore`] (its exact rules' side, `ExactStore`, is in
//! `global/memory/exact.rs`): per-epoch counters in maps, one part per
//! replica, as Redis holds them (`global/redis/sync.rs`), and the replicas' heartbeats (id → last seen).
//! The sync tests and the fleet simulator run the production sync code against it, and the
//! exact rules' tests the exact path; [`MemoryStore::flush_all`] is a Redis that restarted
//! empty, its generation included (`generation.lua`'s). It also holds the RLQS streams each
//! replica publishes per counter (a trip's `Publish`, [`ShardStore::round_trip`]), as
//! `presence.lua` keeps them
//! (`global/redis/presence.rs`), and the reset log the heartbeats read (`sync/reset_log.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

mod exact;

use crate::core::gcra;
use crate::core::{Held, Part};
use crate::global::sync::reset_log::{ResetLog, ResetRead};
use crate::global::sync::store::{
    in_steps, Answer, Beat, Heartbeat, Others, Presence, ShardStore, StoreError, SyncItem, SyncOp,
    Trip,
};

/// A counter: each replica's part (its hits and refunds so far, and the refunds kept out).
pub type Parts = HashMap<u64, Held>;

/// The part an operator's reset adds to a counter ([`MemoryStore::reset_window`]): refunds
/// the store applied, as `reset.lua`'s field `reset-`. Replica ids are random; only one of
/// all ones would share it, here and not in Redis (whose field is named otherwise).
pub const RESET_PART: u64 = u64::MAX;

/// The net count of a counter's parts.
fn net(p: &Parts) -> i64 {
    p.values().map(Held::net).sum()
}

/// A token bucket as the script keeps it.
#[derive(Debug, Default)]
pub struct Bucket {
    /// The `tat` (Unix ns; the script keeps it to the nanosecond too, `gcra.lua`).
    pub tat_ns: u64,
    /// The running count of tokens spent.
    pub spent: u64,
    /// Per replica, the tokens spent and given back it stated, as applied.
    pub stated: HashMap<u64, [u32; 2]>,
}

/// What a bucket call adds that the store has not applied, as the script works it out: the
/// replica `stated` the tokens it spent and gave back so far (each modulo 2^32, only ever
/// growing) and the store applied `held` of them; each difference counts when positive
/// (taken between -2^31 and 2^31: a stale statement reads below what is held). A replica the
/// store holds nothing of (a new bucket, or one Redis lost) gets the call's `delta`. Returns
/// the tokens to add (negative: to give back) and what is held after.
pub fn fresh(held: Option<[u32; 2]>, stated: [u32; 2], delta: i64) -> (i64, [u32; 2]) {
    let Some(held) = held else {
        return (delta, stated);
    };
    let new = |i: usize| i64::from(stated[i].wrapping_sub(held[i]) as i32).max(0);
    let (spent, back) = (new(0), new(1));
    (
        spent - back,
        [
            held[0].wrapping_add(spent as u32),
            held[1].wrapping_add(back as u32),
        ],
    )
}

/// The run's tokens to spend when a call adds `added` where it meant `delta`: as many more
/// or fewer, never past zero (a resent call's tokens were spent when it first ran; a call
/// that stated another's tokens still in flight spends them).
pub fn run_of(spend: i64, delta: i64, added: i64) -> i64 {
    let run = spend + (added - delta);
    if spend >= 0 {
        run.max(0)
    } else {
        run.min(0)
    }
}

/// An in-memory store of counters keyed by (entity, limit, epoch); `down` makes every call
/// fail, `late` every sync call time out after it was applied.
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub counters: Mutex<HashMap<(u128, u8, u64), Parts>>,
    pub calls: AtomicU64,
    pub down: AtomicBool,
    /// Every sync call is applied, then fails with a timeout: a Redis slower than the
    /// client's timeout, which still runs what it was sent.
    pub late: AtomicBool,
    /// Nanoseconds a sync call takes per item before it answers (applied first, as Redis
    /// runs a script whoever waits for it): a store whose calls take as long as they carry.
    pub per_item_ns: AtomicU64,
    /// Exact rules' counters, keyed by (entity, limit, epoch): apart from the sync's, as in
    /// Redis.
    pub exact: Mutex<HashMap<(u128, u8, u64), u64>>,
    /// Exact rules' token buckets, keyed by (entity, limit): the `tat` (Unix ns), apart from
    /// the sync's buckets, as in Redis.
    pub exact_buckets: Mutex<HashMap<(u128, u8), u64>>,
    /// Exact calls received (failed ones included).
    pub exact_calls: AtomicU64,
    /// Token buckets, keyed by (entity, limit).
    pub buckets: Mutex<HashMap<(u128, u8), Bucket>>,
    /// Live replicas: id → last seen (Unix ms).
    pub replicas: Mutex<HashMap<u64, u64>>,
    /// The store's generation, as `generation.lua` keeps it: written by the first heartbeat
    /// that finds none, never expiring.
    pub generation: Mutex<Option<u64>>,
    /// RLQS streams per counter: entity → replica → what it published.
    pub presence: Mutex<HashMap<u128, HashMap<u64, Published>>>,
    /// Presence calls received (failed ones included).
    pub presence_calls: AtomicU64,
    /// The reset log, as `reset_log.lua` keeps it (`ResetLog` is its twin).
    pub reset_log: Mutex<ResetLog>,
}

/// What a replica published for one counter, as a field of `presence.lua`'s hash holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Its streams on the counter.
    pub streams: u32,
    /// Their demand, milli-requests/s.
    pub demand_milli: u64,
    /// When it stops counting (Unix ms, the publisher's fleet clock).
    pub expires_ms: u64,
}

/// One presence item, as `presence.lua` runs it on the counter's hash `fields`: publishes
/// `replica`'s item (a 0 removes it), drops what expired by `now_ms`, and sums the others.
fn publish(
    fields: &mut HashMap<u64, Published>,
    replica: u64,
    it: &Presence,
    now_ms: u64,
    ttl_ms: u64,
) -> Others {
    if it.streams > 0 {
        let p = Published {
            streams: it.streams,
            demand_milli: it.demand_milli(),
            // As the script: a TTL of at least a millisecond.
            expires_ms: now_ms.saturating_add(ttl_ms.max(1)),
        };
        fields.insert(replica, p);
    } else {
        fields.remove(&replica);
    }
    fields.retain(|_, p| p.expires_ms > now_ms);
    let (streams, demand) = fields
        .iter()
        .filter(|(r, _)| **r != replica)
        .fold((0u64, 0u64), |(s, d), (_, p)| {
            (s + u64::from(p.streams), d + p.demand_milli)
        });
    Others::from_milli(streams, demand)
}

impl MemoryStore {
    /// The total of a counter (the sum of its parts; 0 when absent).
    pub fn total(&self, entity: u128, limit: u8, epoch: u64) -> i64 {
        self.counters
            .lock()
            .get(&(entity, limit, epoch))
            .map_or(0, net)
    }

    /// An operator's reset of a window's counters of `epochs`, as `reset.lua` does it: each
    /// counter gets [`RESET_PART`] minus its count, as refunds applied, so the replicas'
    /// statements and floors leave it at 0. Returns the counts before.
    pub fn reset_window(&self, entity: u128, limit: u8, epochs: [u64; 2]) -> [u64; 2] {
        let mut c = self.counters.lock();
        epochs.map(|epoch| {
            let Some(counter) = c.get_mut(&(entity, limit, epoch)) else {
                return 0;
            };
            let before = net(counter).max(0);
            // As the script: a counter at 0 is left as it is.
            if before > 0 {
                counter.entry(RESET_PART).or_default().refunds += before as u64;
            }
            before as u64
        })
    }

    /// An operator's reset of a token bucket, as `reset.lua` does it: full, when held.
    pub fn reset_bucket(&self, entity: u128, limit: u8) {
        if let Some(b) = self.buckets.lock().get_mut(&(entity, limit)) {
            b.tat_ns = 0;
        }
    }

    /// Forgets every counter and the generation, as a Redis without persistence does when
    /// it restarts.
    pub fn flush_all(&self) {
        self.counters.lock().clear();
        self.buckets.lock().clear();
        self.presence.lock().clear();
        self.reset_log.lock().clear();
        *self.generation.lock() = None;
    }
}

/// A window item, as the script takes it in: the replica's part raised to what the item
/// states, hits and refunds apart, new refunds applied only as far as the count holds
/// ([`Held::state`]); the sums, each at least its floor less the counter's applied refunds.
fn window(
    c: &mut HashMap<(u128, u8, u64), Parts>,
    replica: u64,
    it: &SyncItem,
    epochs: [u64; 2],
    parts: [Part; 2],
    floors: [u64; 2],
) -> [u64; 2] {
    // Epoch 0 has no previous epoch: the item names it twice, with the same part.
    let n = if epochs[0] == epochs[1] { 1 } else { 2 };
    for i in 0..n {
        // As the script: a read (nothing counted) creates nothing.
        if parts[i] != Part::default() {
            let counter = c.entry((it.entity, it.limit, epochs[i])).or_default();
            let mine = counter.get(&replica).copied().unwrap_or_default();
            let others = net(counter) - mine.net();
            counter.entry(replica).or_default().state(parts[i], others);
        }
    }
    std::array::from_fn(|i| {
        let key = (it.entity, it.limit, epochs[i]);
        let refunds: u64 = c
            .get(&key)
            .map_or(0, |p| p.values().map(Held::applied).sum());
        let floor = floors[i].saturating_sub(refunds) as i64;
        c.get(&key).map_or(0, net).max(floor).max(0) as u64
    })
}

impl MemoryStore {
    /// Applies a sync call's items as `sync.lua` and `bucket.lua` do, and returns their
    /// totals.
    fn apply(&self, replica: u64, items: &[SyncItem]) -> Vec<[u64; 2]> {
        let mut c = self.counters.lock();
        let mut b = self.buckets.lock();
        items
            .iter()
            .map(|it| match it.op {
                SyncOp::Window {
                    epochs,
                    parts,
                    floors,
                    ..
                } => window(&mut c, replica, it, epochs, parts, floors),
                SyncOp::Bucket {
                    delta,
                    spend,
                    now_us,
                    since_us,
                    interval_ns,
                    max_ahead_ns,
                    floor_us,
                    stated,
                    ..
                } => {
                    let key = (it.entity, it.limit);
                    let now = now_us.saturating_mul(1000);
                    let held = b.get(&key);
                    let (mut tat, mut spent) =
                        held.map_or((floor_us.saturating_mul(1000), 0), |h| (h.tat_ns, h.spent));
                    let (delta_in, now_held) = fresh(
                        held.and_then(|h| h.stated.get(&replica).copied()),
                        stated,
                        delta,
                    );
                    let spend = run_of(spend, delta, delta_in);
                    if delta_in != 0 || spend != 0 {
                        // As the script: in whole nanoseconds.
                        let since = since_us.saturating_mul(1000);
                        tat = gcra::run(tat, since, now, spend, interval_ns, max_ahead_ns);
                        spent = (spent as i64).saturating_add(delta_in).max(0) as u64;
                        let e = b.entry(key).or_default();
                        (e.tat_ns, e.spent) = (tat, spent);
                        e.stated.insert(replica, now_held);
                    } else if held.is_none() && tat > now {
                        b.insert(
                            key,
                            Bucket {
                                tat_ns: tat,
                                spent,
                                ..Bucket::default()
                            },
                        );
                    }
                    [tat / 1000, spent]
                }
            })
            .collect()
    }
}

impl MemoryStore {
    pub async fn sync(
        &self,
        replica: u64,
        items: &[SyncItem],
    ) -> Result<Vec<[u64; 2]>, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::connection("connection refused"));
        }
        let totals = self.apply(replica, items);
        let per_item = self.per_item_ns.load(Ordering::Relaxed);
        if per_item > 0 {
            let took = per_item.saturating_mul(items.len() as u64);
            tokio::time::sleep(std::time::Duration::from_nanos(took)).await;
        }
        if self.late.load(Ordering::Relaxed) {
            return Err(StoreError::Timeout(std::time::Duration::from_millis(100)));
        }
        Ok(totals)
    }

    pub async fn heartbeat(&self, beat: &Heartbeat) -> Result<Beat, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::connection("connection refused"));
        }
        let generation = *self.generation.lock().get_or_insert(beat.new_generation);
        let mut r = self.replicas.lock();
        if beat.leaving {
            r.remove(&beat.replica);
        } else {
            r.insert(beat.replica, beat.now_ms);
        }
        let oldest = beat.now_ms.saturating_sub(beat.ttl_ms);
        r.retain(|_, seen| *seen >= oldest);
        // The log is read when the beat asks (a standalone Redis reads it in the same script).
        let resets =
            (beat.resets != ResetRead::Skip).then(|| self.reset_log.lock().read(beat.resets));
        Ok(Beat {
            live: r.len() as u32,
            generation: Some(generation),
            resets,
        })
    }

    pub async fn presence(
        &self,
        replica: u64,
        items: &[Presence],
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<Others>, StoreError> {
        self.presence_calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::connection("connection refused"));
        }
        let mut all = self.presence.lock();
        let out = items
            .iter()
            .map(|it| {
                let fields = all.entry(it.entity).or_default();
                let others = publish(fields, replica, it, now_ms, ttl_ms);
                // As Redis: a hash with no field left is no key.
                if fields.is_empty() {
                    all.remove(&it.entity);
                }
                others
            })
            .collect();
        Ok(out)
    }
}

impl ShardStore for MemoryStore {
    fn name(&self) -> &str {
        "memory"
    }
    async fn round_trip(&self, replica: u64, trip: Trip<'_>) -> Result<Answer, StoreError> {
        in_steps(
            trip,
            |items| self.sync(replica, items),
            |beat| self.heartbeat(beat),
            |p| self.presence(replica, p.items, p.now_ms, p.ttl_ms),
        )
        .await
    }
    async fn replicas(&self) -> Result<Vec<(u64, u64)>, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::connection("connection refused"));
        }
        let mut all: Vec<(u64, u64)> = self.replicas.lock().iter().map(|(&r, &t)| (r, t)).collect();
        all.sort_unstable();
        Ok(all)
    }
    /// As Redis sends them: one script call per 500 items.
    fn commands_for(&self, items: usize) -> usize {
        items.div_ceil(500)
    }
    async fn time_ms(&self) -> Result<u64, StoreError> {
        Ok(1_700_000_005_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 1_700_000_040_000;
    const EPOCH: u64 = NOW_MS / 60_000;

    /// A replica's statement of entity 1's counter in the current epoch, floor 0.
    fn window(hits: u64, refunds: u64) -> SyncItem {
        SyncItem {
            entity: 1,
            limit: 0,
            op: SyncOp::Window {
                epochs: [EPOCH, EPOCH - 1],
                parts: [Part { hits, refunds }, Part::default()],
                floors: [0, 0],
                ttl_ms: 120_000,
            },
        }
    }

    async fn count(m: &MemoryStore, replica: u64, it: SyncItem) -> u64 {
        m.sync(replica, &[it]).await.unwrap()[0][0]
    }

    #[tokio::test]
    async fn refunds_past_the_count_are_kept_out_once() {
        let m = MemoryStore::default();
        assert_eq!(count(&m, 1, window(5, 0)).await, 5);
        assert_eq!(count(&m, 2, window(5, 0)).await, 10);
        // Each gives back 10: the second finds the count at 0 (it took it to -10).
        assert_eq!(count(&m, 1, window(5, 10)).await, 0);
        assert_eq!(count(&m, 2, window(5, 10)).await, 0);
        assert_eq!(m.total(1, 0, EPOCH), 0);
        // Resent, or arriving late, once the count has grown: nothing more is given back.
        assert_eq!(count(&m, 3, window(4, 0)).await, 4);
        assert_eq!(count(&m, 2, window(5, 10)).await, 4);
        assert_eq!(count(&m, 1, window(5, 3)).await, 4);
        let held = |r| m.counters.lock()[&(1, 0, EPOCH)][&r];
        let kept = |hits, refunds, kept| Held {
            hits,
            refunds,
            kept,
        };
        assert_eq!(
            (held(1), held(2), held(3)),
            (kept(5, 10, 0), kept(5, 10, 10), kept(4, 0, 0))
        );
    }

    #[tokio::test]
    async fn a_lost_counter_reads_its_floor_less_the_refunds_applied_and_never_below_zero() {
        let m = MemoryStore::default();
        let read = |floor| {
            let mut it = window(0, 0);
            if let SyncOp::Window { floors, .. } = &mut it.op {
                *floors = [floor, 0];
            }
            it
        };
        // Replica 1 counts 6, replica 3 reads them; replica 2 gives back 10: 6 apply.
        count(&m, 1, window(6, 0)).await;
        assert_eq!(count(&m, 3, read(0)).await, 6);
        assert_eq!(count(&m, 2, window(0, 10)).await, 0);
        // The store loses the counter. Replica 3's read answers its floor, 6, until the
        // replicas restate their parts: not room the fleet never had.
        m.flush_all();
        assert_eq!(count(&m, 3, read(6)).await, 6);
        // Replica 2's refunds restated before the hits they gave back find nothing to take
        // from, and are kept out: the count errs high, never below zero.
        assert_eq!(count(&m, 2, window(0, 10)).await, 0);
        assert_eq!(count(&m, 3, read(6)).await, 6);
        assert_eq!(count(&m, 1, window(6, 0)).await, 6);
    }
}
