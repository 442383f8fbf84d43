//! The bounded in-memory table of entities (one per rule + descriptor values): compact
//! records in sharded, densely packed chunks, an open-addressing index of 4-byte positions,
//! eviction that never forgets a live count (a sketch keeps an over-estimate), and idle
//! expiry by a sweep rather than per-entry timers.
//!
//! Why not moka: its per-entry bookkeeping (a node, a timer wheel entry, an `Arc` per
//! value, a per-entity `Vec` of states) cost ~640 bytes an entity; here a record is the key,
//! its state inline and a few stamps (~140 bytes, docs/performance.md). Each shard is one
//! mutex, held for a decision's few nanoseconds and never across an `.await`: requests for
//! one entity are exact under concurrency, and requests for different shards never contend.
//!
//! Eviction (a full table, on insert, from the new key's shard) takes what costs nothing first: an entity whose
//! windows have passed or whose buckets are full forgets nothing. Otherwise the least
//! recently used of a sample goes, and its counts are folded into the shard's sketch (`sketch.rs`); a
//! returning value starts from the sketch's estimate, never below what it had, while a value
//! never seen reads (almost always) nothing. Entities queued for a sync or in one are never
//! evicted: their hits have not reached the store yet.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::clock::UnixMillis;
use super::limit::Limit;
use super::state::LimitState;
use shard::{Record, Shard};

pub use counts::{
    period_of, step_of, Candidate, Candidates, Marks, RuleCounts, MAX_CANDIDATES,
    MAX_CANDIDATE_BYTES,
};

mod counts;
mod release;
mod shard;
mod sketch;

/// Records an eviction looks at (all of them in a smaller shard): enough that a free one is
/// usually among them, few enough that an insert into a full table stays cheap.
const SAMPLE: usize = 16;

/// Records a sweep step looks at under one lock hold.
const SWEEP_STEP: usize = 512;

/// Shards are at least this many entities each: tables up to this size are one shard, so
/// eviction order in a small table is exact.
const MIN_PER_SHARD: u64 = 8192;

/// The most shards.
const MAX_SHARDS: usize = 64;

/// The states of one entity, one per limit of its rule: inline for a single limit (the usual
/// case), so such an entity needs no allocation of its own.
#[derive(Debug, Clone, PartialEq)]
pub enum States {
    /// A rule of one limit.
    One(LimitState),
    /// A rule with `additional_limits`.
    Many(Box<[LimitState]>),
}

impl std::ops::Deref for States {
    type Target = [LimitState];
    fn deref(&self) -> &[LimitState] {
        match self {
            States::One(s) => std::slice::from_ref(s),
            States::Many(s) => s,
        }
    }
}

impl std::ops::DerefMut for States {
    fn deref_mut(&mut self) -> &mut [LimitState] {
        match self {
            States::One(s) => std::slice::from_mut(s),
            States::Many(s) => s,
        }
    }
}

impl FromIterator<LimitState> for States {
    fn from_iter<I: IntoIterator<Item = LimitState>>(iter: I) -> Self {
        let mut it = iter.into_iter();
        match (it.next(), it.next()) {
            (Some(one), None) => States::One(one),
            (first, second) => States::Many(first.into_iter().chain(second).chain(it).collect()),
        }
    }
}

/// The mutable part of an entity.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityState {
    /// One state per limit, in the rule's order.
    pub states: States,
    /// When the last sync started (Unix ms).
    pub last_sync_ms: u64,
    /// In its shard's sync queue (or in a sync in flight): at most once.
    pub queued: bool,
    /// Syncs of this entity in flight: at most one, but for burst reads (two, the second
    /// started while the first is under way: `global/sync/shard.rs`).
    pub in_flight: u8,
    /// What its rule's per-period counts have counted of it (`counts.rs`).
    pub marks: Marks,
}

impl EntityState {
    /// Whether a sync holds it: its hits may not have reached the store yet.
    fn busy(&self) -> bool {
        self.queued || self.in_flight > 0
    }
}

/// An entity as [`EntityTable::with`] lends it, under its shard's lock.
#[derive(Debug)]
pub struct EntityMut<'a> {
    /// The entity's identity (see `rules::Match::entity`); names its Redis keys.
    pub key: u128,
    /// Its rule's limits, as interned by the table ([`EntityTable::limits`]).
    pub set: LimitSet,
    /// Its counters and sync bookkeeping.
    pub state: &'a mut EntityState,
}

/// A rule's limits, interned per rule id and limit list: 4 bytes in a record instead of a
/// pointer and a length, and the key of the rule's [`RuleCounts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSet(u32);

/// Limits of the entity table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Most entities held (at least 1); past it the table evicts.
    pub max_entries: u64,
    /// An entity unused this long is dropped once it holds nothing (its windows passed, its
    /// buckets full).
    pub idle_timeout: Duration,
    /// Upper bound on an entity's life since it was last used, if set, even when it still
    /// counts something (what it counts goes to the sketch).
    pub ttl: Option<Duration>,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings {
            max_entries: 1_000_000,
            idle_timeout: Duration::from_secs(60),
            ttl: None,
        }
    }
}

/// Entities that left the table, by why.
#[derive(Debug, Default)]
pub struct TableStats {
    /// Evicted by a full table, holding nothing.
    pub evicted_free: AtomicU64,
    /// Evicted by a full table while counting: folded into the sketch.
    pub evicted_live: AtomicU64,
    /// Dropped by the sweep: idle and holding nothing.
    pub expired_idle: AtomicU64,
    /// Dropped by the sweep past `CACHE_TTL`, folded into the sketch when counting.
    pub expired_ttl: AtomicU64,
    /// Entities created from the sketch's estimate (something folded there matched).
    pub restored: AtomicU64,
    /// Inserts past the bound because every record sampled was held by a sync.
    pub over_bound: AtomicU64,
}

fn secs(now: UnixMillis) -> u32 {
    (now.0 / 1000).min(u64::from(u32::MAX)) as u32
}

/// The rules' limit sets, interned: one per rule id and limit list (a rule's limits are
/// part of its id, so about one per rule, and one per distinct limit a request supplies,
/// whose rule id is 0), each with its rule's counts. A set nothing uses is freed and its id
/// used again (`release.rs`).
#[derive(Debug, Default)]
struct LimitSets {
    ids: std::collections::HashMap<(u64, Box<[Limit]>), u32>,
    sets: Vec<Arc<[Limit]>>,
    counts: Vec<Arc<RuleCounts>>,
    /// Ids of freed sets, to use again.
    free: Vec<u32>,
}

impl LimitSets {
    fn intern(&mut self, rule: u64, limits: &[Limit], budget: &Arc<AtomicUsize>) -> u32 {
        if let Some(&id) = self.ids.get(&(rule, limits.into())) {
            return id;
        }
        let counts = Arc::new(RuleCounts::new(budget.clone()));
        let id = match self.free.pop() {
            Some(id) => {
                self.sets[id as usize] = limits.into();
                self.counts[id as usize] = counts;
                id
            }
            None => {
                self.sets.push(limits.into());
                self.counts.push(counts);
                (self.sets.len() - 1) as u32
            }
        };
        self.ids.insert((rule, limits.into()), id);
        id
    }
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    /// Records held, all shards: past `settings.max_entries` an insert evicts from its
    /// shard, so the bound holds however unevenly the keys spread.
    len: AtomicUsize,
    /// Cells per row of a shard's sketch: a quarter of its share of the bound.
    sketch_width: usize,
    settings: CacheSettings,
    sets: RwLock<LimitSets>,
    stats: TableStats,
    /// Bytes of descriptor entries every rule's candidates hold (`counts.rs`).
    candidate_bytes: Arc<AtomicUsize>,
}

/// The entity table (cheap to clone: a handle).
#[derive(Clone)]
pub struct EntityTable {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EntityTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntityTable")
            .field("entries", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// Whether [`EntityTable::with`] found the entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// It was there.
    Hit,
    /// It was created.
    Miss,
}

impl EntityTable {
    /// An empty table with these limits.
    pub fn new(settings: CacheSettings) -> Self {
        let max = settings.max_entries.max(1);
        let settings = CacheSettings {
            max_entries: max,
            ..settings
        };
        let shards = (max / MIN_PER_SHARD)
            .clamp(1, MAX_SHARDS as u64)
            .next_power_of_two()
            .min(MAX_SHARDS as u64) as usize;
        let per_shard = max.div_ceil(shards as u64) as usize;
        EntityTable {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::new(Shard::new())).collect(),
                len: AtomicUsize::new(0),
                sketch_width: (per_shard / 4).max(64),
                settings,
                sets: RwLock::default(),
                stats: TableStats::default(),
                candidate_bytes: Arc::default(),
            }),
        }
    }

    fn shard(&self, key: u128) -> &Mutex<Shard> {
        let shards = &self.inner.shards;
        &shards[((key >> 64) as usize) & (shards.len() - 1)]
    }

    /// Calls `f` on the entity `key` at `now`, created for `limits` (called only then) if
    /// absent, from the sketch's estimate when something evicted matches it. The shard's
    /// lock is held meanwhile: `f` must be quick and must not touch the table.
    pub fn with<R>(
        &self,
        key: u128,
        now: UnixMillis,
        limits: impl FnOnce() -> Vec<Limit>,
        f: impl FnOnce(EntityMut<'_>) -> R,
    ) -> (R, Lookup) {
        self.with_rule(key, now, || (0, limits()), f)
    }

    /// [`EntityTable::with`], the entity counted in its rule's [`RuleCounts`]: `rule` gives
    /// the rule's id and limits (called only to create the entity).
    pub fn with_rule<R>(
        &self,
        key: u128,
        now: UnixMillis,
        rule: impl FnOnce() -> (u64, Vec<Limit>),
        f: impl FnOnce(EntityMut<'_>) -> R,
    ) -> (R, Lookup) {
        let mut shard = self.shard(key).lock();
        let (pos, lookup) = match shard.find(key) {
            Some(pos) => (pos, Lookup::Hit),
            None => {
                let (id, limits) = rule();
                (self.create(&mut shard, key, now, id, &limits), Lookup::Miss)
            }
        };
        let record = shard.at_mut(pos);
        record.used_s = secs(now);
        let r = f(EntityMut {
            key,
            set: LimitSet(record.set),
            state: &mut record.state,
        });
        (r, lookup)
    }

    /// Calls `f` on the entity `key` if it is held (its recency unchanged: a sync is no use).
    pub fn get<R>(&self, key: u128, f: impl FnOnce(EntityMut<'_>) -> R) -> Option<R> {
        let mut shard = self.shard(key).lock();
        let pos = shard.find(key)?;
        let record = shard.at_mut(pos);
        Some(f(EntityMut {
            key,
            set: LimitSet(record.set),
            state: &mut record.state,
        }))
    }

    /// The states of entity `key` as a request at `now` would find them, without creating it
    /// or touching its recency: a copy of its own when held, else what the shard's sketch
    /// keeps of it when it was evicted while counting; `None` when neither (fresh states).
    pub fn peek(&self, key: u128, limits: &[Limit], now: UnixMillis) -> Option<Vec<LimitState>> {
        let shard = self.shard(key).lock();
        if let Some(pos) = shard.find(key) {
            return Some(shard.at(pos).state.states.to_vec());
        }
        let sketch = shard.sketch.as_ref()?;
        let kept: Vec<_> = (limits.iter().enumerate())
            .map(|(i, l)| sketch.query(key, i, l, now))
            .collect();
        kept.iter().any(Option::is_some).then(|| {
            limits
                .iter()
                .zip(kept)
                .map(|(l, k)| LimitState::restored(l, k))
                .collect()
        })
    }

    /// The limits of an interned set.
    pub fn limits(&self, set: LimitSet) -> Arc<[Limit]> {
        self.inner.sets.read().sets[set.0 as usize].clone()
    }

    /// The counts of the rule `rule` with `limits`, interned now if new: resolved once per
    /// rule when rules are compiled, so a request reaches them without a lookup.
    pub fn rule_counts(&self, rule: u64, limits: &[Limit]) -> Arc<RuleCounts> {
        self.with_set(rule, limits, |sets, id| sets.counts[id as usize].clone())
    }

    /// Bytes of descriptor entries held by every rule's candidates.
    pub fn candidate_bytes(&self) -> usize {
        self.inner.candidate_bytes.load(Ordering::Relaxed)
    }

    /// Counts a record of `set` in or out of its rule's `tracked`.
    fn track(sets: &LimitSets, set: u32, n: i64) {
        sets.counts[set as usize].add_tracked(n);
    }

    fn create(
        &self,
        shard: &mut Shard,
        key: u128,
        now: UnixMillis,
        rule: u64,
        limits: &[Limit],
    ) -> usize {
        if self.inner.len.load(Ordering::Relaxed) as u64 >= self.inner.settings.max_entries
            && shard.len > 0
        {
            self.evict(shard, now);
        }
        self.inner.len.fetch_add(1, Ordering::Relaxed);
        let set = self.set_tracked(rule, limits);
        // Each limit starts from what the sketch keeps of an evicted entity with this key
        // (nothing before the shard's first live eviction).
        let mut restored = false;
        let states: States = limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let kept = shard.sketch.as_ref().and_then(|k| k.query(key, i, l, now));
                restored |= kept.is_some();
                LimitState::restored(l, kept)
            })
            .collect();
        if restored {
            self.inner.stats.restored.fetch_add(1, Ordering::Relaxed);
        }
        shard.push(Record {
            key: [key as u64, (key >> 64) as u64],
            set,
            used_s: secs(now),
            state: EntityState {
                states,
                last_sync_ms: 0,
                queued: false,
                in_flight: 0,
                marks: Marks::default(),
            },
        })
    }

    /// Makes room in a full table, from `shard`: a sampled record that holds nothing, else the least
    /// recently used of the sample (the emptiest among equals), folded into the sketch.
    /// Records a sync holds are passed over; when the sample holds nothing else, nothing is
    /// evicted and the shard goes past its bound (the sync queue's bound limits by how much).
    fn evict(&self, shard: &mut Shard, now: UnixMillis) {
        let sets = self.inner.sets.read();
        let n = shard.len;
        let sample = n.min(SAMPLE);
        let start = if n <= SAMPLE { 0 } else { shard.hand % n };
        let mut best: Option<(usize, u32, f64)> = None;
        for j in 0..sample {
            let pos = (start + j) % n;
            let r = shard.at(pos);
            if r.state.busy() {
                continue;
            }
            let limits = &sets.sets[r.set as usize];
            if r.holds_nothing(limits, now) {
                shard.hand = pos;
                let record = shard.remove(pos);
                Self::track(&sets, record.set, -1);
                self.inner.len.fetch_sub(1, Ordering::Relaxed);
                self.inner
                    .stats
                    .evicted_free
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            let pressure = (r.state.states.iter().zip(limits.iter()))
                .map(|(s, l)| s.pressure(l, now))
                .fold(0.0, f64::max);
            if best.is_none_or(|(_, used, p)| (r.used_s, pressure) < (used, p)) {
                best = Some((pos, r.used_s, pressure));
            }
        }
        shard.hand = start + sample;
        match best {
            Some((pos, _, _)) => {
                let record = shard.remove(pos);
                Self::track(&sets, record.set, -1);
                self.inner.len.fetch_sub(1, Ordering::Relaxed);
                let limits = sets.sets[record.set as usize].clone();
                shard.fold(&record, &limits, now, self.inner.sketch_width);
                self.inner
                    .stats
                    .evicted_live
                    .fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.inner.stats.over_bound.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops idle entities: those unused for `CACHE_IDLE_TIMEOUT` that hold nothing, and
    /// those unused for `CACHE_TTL` (when set) whatever they hold, folded into the sketch;
    /// then frees the limit sets nothing uses any more (`release.rs`).
    /// Looks at up to `budget` records a shard, a few hundred under one lock hold, going on
    /// where the last sweep stopped. Returns how many it dropped.
    pub fn sweep(&self, now: UnixMillis, budget: usize) -> u64 {
        let settings = &self.inner.settings;
        let now_s = secs(now);
        let idle_s = settings.idle_timeout.as_secs().min(u64::from(u32::MAX)) as u32;
        let ttl_s = settings
            .ttl
            .map(|t| t.as_secs().min(u64::from(u32::MAX)) as u32);
        let width = self.inner.sketch_width;
        let mut dropped = 0;
        for shard in self.inner.shards.iter() {
            let mut left = budget.min(shard.lock().len);
            while left > 0 {
                let mut shard = shard.lock();
                let sets = self.inner.sets.read();
                let step = left.min(SWEEP_STEP);
                left -= step;
                for _ in 0..step {
                    if shard.len == 0 {
                        break;
                    }
                    let pos = shard.sweep % shard.len;
                    let r = shard.at(pos);
                    let idle = now_s.saturating_sub(r.used_s);
                    let limits = &sets.sets[r.set as usize];
                    let ttl_out = ttl_s.is_some_and(|t| idle >= t);
                    if r.state.busy() || !(ttl_out || idle >= idle_s) {
                        shard.sweep = pos + 1;
                        continue;
                    }
                    let free = r.holds_nothing(limits, now);
                    if !free && !ttl_out {
                        shard.sweep = pos + 1;
                        continue;
                    }
                    // The last record moves here: look at this position again.
                    let record = shard.remove(pos);
                    Self::track(&sets, record.set, -1);
                    self.inner.len.fetch_sub(1, Ordering::Relaxed);
                    if !free {
                        let limits = limits.clone();
                        shard.fold(&record, &limits, now, width);
                    }
                    let stat = if free {
                        &self.inner.stats.expired_idle
                    } else {
                        &self.inner.stats.expired_ttl
                    };
                    stat.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                }
            }
        }
        // Sets only the dropped records used may be free now.
        self.release_unused_sets();
        dropped
    }

    /// How many entities are held.
    pub fn len(&self) -> u64 {
        self.inner.len.load(Ordering::Relaxed) as u64
    }

    /// Whether no entity is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many entities the table holds before it evicts.
    pub fn capacity(&self) -> u64 {
        self.inner.settings.max_entries
    }

    /// Why entities left the table.
    pub fn stats(&self) -> &TableStats {
        &self.inner.stats
    }
}

#[cfg(test)]
mod tests;
