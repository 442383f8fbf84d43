//! Per-rule figures the table keeps beside its records, for the utilization gauges and
//! `GET /top`: how many entities a rule tracks, how many reached its near ratio or went over
//! in the current period ([`RuleCounts`]), each entity's marks for the period ([`Marks`]),
//! and the bounded candidates for the keys nearest their limit ([`Candidates`]).
//!
//! Nothing here scans: `tracked` moves by one as the table creates and drops records; "near"
//! and "over" count *crossings*, each entity at most once a period (its [`Marks`] say whether
//! it has been counted), into a counter stamped with the period it counts for, so a read
//! after that period reads 0. A period is one window of the rule's first limit, aligned to
//! the epoch as fixed windows are: for a fixed window the counts are exact (a count only
//! grows within its window); for a sliding window or a token bucket they count the keys that
//! were near (or denied) at some moment of the current period, which the doc calls out
//! (docs/operations.md, "Limits as metrics").
//!
//! Candidates: per rule at most [`MAX_CANDIDATES`] keys with their descriptor entries,
//! admitted when an entity's ratio (count ÷ limit) climbs a step ([`step_of`]) and beats the
//! current minimum, read from an atomic first, so the request path takes the candidates'
//! lock only a few dozen times per entity and period at most, and never for an entity that
//! could not get in. Entries' bytes count against one budget shared by every rule
//! ([`MAX_CANDIDATE_BYTES`]). The counts are not kept here: `/top` re-reads each
//! candidate's entity when it answers.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The most candidates a rule keeps (`GET /top` answers at most this many keys, too).
pub const MAX_CANDIDATES: usize = 1000;

/// The most bytes of descriptor keys and values every rule's candidates hold together:
/// past it a new key is not admitted until others leave.
pub const MAX_CANDIDATE_BYTES: usize = 16 << 20;

/// Steps of a ratio per limit: an entity is offered as a candidate when its ratio enters a
/// new 1/32 of its limit (and once when it first counts in a period).
const STEPS_PER_LIMIT: f64 = 32.0;

/// The step of a ratio: 1 for any count below 1/32 of the limit, then one more per 1/32
/// (255 at most, near eight times the limit).
pub fn step_of(ratio: f64) -> u8 {
    (1.0 + ratio.max(0.0) * STEPS_PER_LIMIT).min(255.0) as u8
}

/// An entity's marks for one period: whether it has been counted near and over, and the
/// highest step it was offered as a candidate at. 6 bytes, in what was its record's padding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// The low 16 bits of the period (plus one) these marks are for: a record still held
    /// 65,536 periods after it was last counted (18 hours of per-second windows with a long
    /// `CACHE_IDLE_TIMEOUT`) would be taken as counted once too few.
    pub period: u16,
    /// Counted in its rule's `near` this period.
    pub near: bool,
    /// Counted in its rule's `over` this period.
    pub over: bool,
    /// The highest step it was offered at this period.
    pub step: u8,
}

impl Marks {
    /// Notes a counted decision in `period` (plus one) at `ratio` of the limit, near or
    /// over: each counted once a period in `counts`. Returns the ratio to offer the entity
    /// to the candidates at, when it climbed a step.
    pub fn update(
        &mut self,
        counts: &RuleCounts,
        period: u32,
        ratio: f64,
        near: bool,
        over: bool,
    ) -> Option<f64> {
        if self.period != period as u16 {
            *self = Marks {
                period: period as u16,
                ..Marks::default()
            };
        }
        if near && !self.near {
            self.near = true;
            bump(&counts.near, period);
        }
        if over && !self.over {
            self.over = true;
            bump(&counts.over, period);
        }
        let step = step_of(ratio);
        (step > self.step).then(|| {
            self.step = step;
            ratio
        })
    }
}

/// Adds one to a period counter: the period in the high 32 bits, the count in the low 32
/// (one word, so a new period and its first count land together).
fn bump(counter: &AtomicU64, period: u32) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(if (v >> 32) as u32 == period {
            v.saturating_add(1).min(v | u64::from(u32::MAX))
        } else {
            (u64::from(period) << 32) | 1
        })
    });
}

/// A period counter's count if it is for `period`, else 0 (its period passed).
fn read(counter: &AtomicU64, period: u32) -> u64 {
    let v = counter.load(Ordering::Relaxed);
    if (v >> 32) as u32 == period {
        v & u64::from(u32::MAX)
    } else {
        0
    }
}

/// One rule's figures (one per rule id and limit list, interned by the table).
#[derive(Debug)]
pub struct RuleCounts {
    /// Records held for the rule.
    tracked: AtomicI64,
    near: AtomicU64,
    over: AtomicU64,
    /// The keys nearest their limit.
    pub candidates: Candidates,
}

impl RuleCounts {
    pub(super) fn new(budget: Arc<AtomicUsize>) -> Self {
        RuleCounts {
            tracked: AtomicI64::new(0),
            near: AtomicU64::new(0),
            over: AtomicU64::new(0),
            candidates: Candidates::new(budget),
        }
    }

    pub(super) fn add_tracked(&self, n: i64) {
        self.tracked.fetch_add(n, Ordering::Relaxed);
    }

    /// Entities the table holds for the rule.
    pub fn tracked(&self) -> u64 {
        self.tracked.load(Ordering::Relaxed).max(0) as u64
    }

    /// Entities counted at or past the near ratio in `period` (plus one); 0 for another.
    pub fn near(&self, period: u32) -> u64 {
        read(&self.near, period)
    }

    /// Entities counted over the limit in `period` (plus one); 0 for another.
    pub fn over(&self, period: u32) -> u64 {
        read(&self.over, period)
    }
}

/// The period (plus one) of `now_ms` for a rule whose first window is `window_ms` long.
pub fn period_of(now_ms: u64, window_ms: u64) -> u32 {
    (now_ms / window_ms.max(1))
        .saturating_add(1)
        .min(u64::from(u32::MAX)) as u32
}

/// One candidate: an entity and its descriptor entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The entity's key in the table.
    pub key: u128,
    /// Its descriptor entries (key, value).
    pub entries: Arc<[(Box<str>, Box<str>)]>,
    /// Its ratio when last offered.
    ratio: f64,
    /// The period of that ratio: an older one counts as 0.
    period: u32,
}

impl Candidate {
    fn bytes(&self) -> usize {
        self.entries.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    fn ratio_at(&self, period: u32) -> f64 {
        if self.period == period {
            self.ratio
        } else {
            0.0
        }
    }
}

/// Hashes an entity key to its own low 64 bits: the key is already a hash (XXH3-128), as the
/// table's index takes it (`shard.rs`). SipHash over it cost the request path some 300
/// instructions an offer (`benches/cpu.sh`, `MODE=instructions`).
#[derive(Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64;
    }

    /// Not reached for a `u128` key (`write_u128` above); mixes bytes in, should it be.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// The candidates' index: an entity key to its place in the list.
type Index = HashMap<u128, usize, BuildHasherDefault<KeyHasher>>;

#[derive(Debug, Default)]
struct Inner {
    list: Vec<Candidate>,
    index: Index,
    /// The lowest candidate for a period, as [`lowest`] finds it, kept between offers: a
    /// full rule's every offer needs it (the floor), and a scan of the 1,000 candidates for
    /// each one cost more than the rest of the request (`benches/cpu.sh`).
    low: Option<Low>,
}

/// [`Inner::low`]: the period, and the position and ratio of its lowest candidate.
#[derive(Debug, Clone, Copy)]
struct Low {
    period: u32,
    at: usize,
    ratio: f64,
}

impl Inner {
    /// The position and ratio of the lowest candidate in `period`, found again only when
    /// an offer may have raised it.
    fn lowest(&mut self, period: u32) -> Option<(usize, f64)> {
        match self.low {
            Some(l) if l.period == period => Some((l.at, l.ratio)),
            _ => {
                let found = lowest(&self.list, period);
                self.low = found.map(|(at, ratio)| Low { period, at, ratio });
                found
            }
        }
    }

    /// Keeps [`Inner::low`] true after the candidate at `at` took `ratio` in `period`:
    /// the lowest stays the lowest unless that candidate was it and rose (then it is found
    /// again, [`Inner::rose`]), and a lower one, or an equal one earlier in the list (the
    /// scan's first), takes its place.
    fn moved(&mut self, at: usize, ratio: f64, period: u32) {
        let Some(l) = self.low.filter(|l| l.period == period) else {
            self.low = None;
            return;
        };
        if ratio < l.ratio || (ratio == l.ratio && at <= l.at) {
            self.low = Some(Low { period, at, ratio });
        } else if at == l.at {
            self.rose(l);
        }
    }

    /// The lowest `l` rose (or was replaced by a higher one): the next lowest is the first
    /// candidate after it at the same ratio, if there is one, as the scan would find it
    /// (those before it are higher, those after it no lower); else it is found again. In a
    /// new period every candidate counts 0, and offers that come in list order would each
    /// raise the lowest: a scan of the list each time cost 1.2k instructions a request
    /// (`benches/cpu.sh`, `MODE=instructions`), the step to the next a few.
    fn rose(&mut self, l: Low) {
        let next = (self.list.iter().enumerate().skip(l.at + 1))
            .find(|(_, c)| c.ratio_at(l.period).total_cmp(&l.ratio).is_eq());
        self.low = next.map(|(at, _)| Low { at, ..l });
    }
}

/// The candidates of one rule for `GET /top` (see the module docs).
#[derive(Debug)]
pub struct Candidates {
    /// When full: the lowest ratio held (as f32 bits, low half) and its period (high half);
    /// 0 when not full. An offer at or below it for the same period need not lock.
    floor: AtomicU64,
    inner: Mutex<Inner>,
    budget: Arc<AtomicUsize>,
}

impl Candidates {
    fn new(budget: Arc<AtomicUsize>) -> Self {
        Candidates {
            floor: AtomicU64::new(0),
            inner: Mutex::default(),
            budget,
        }
    }

    /// Whether an offer at `ratio` in `period` could get in: one atomic load.
    pub fn could_admit(&self, ratio: f64, period: u32) -> bool {
        let f = self.floor.load(Ordering::Relaxed);
        (f >> 32) as u32 != period || ratio > f64::from(f32::from_bits(f as u32))
    }

    /// Offers `key` at `ratio` in `period`; `entries` (called only to add it) are its
    /// descriptor's. A held key's ratio is updated; a new one takes the place of the lowest
    /// when the rule is full and it beats it, if the byte budget has room.
    pub fn offer<E>(&self, key: u128, ratio: f64, period: u32, entries: E)
    where
        E: FnOnce() -> Vec<(Box<str>, Box<str>)>,
    {
        if !self.could_admit(ratio, period) {
            return;
        }
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if let Some(&i) = inner.index.get(&key) {
            let c = &mut inner.list[i];
            (c.ratio, c.period) = (ratio, period);
            inner.moved(i, ratio, period);
        } else {
            let c = Candidate {
                key,
                entries: entries().into(),
                ratio,
                period,
            };
            let bytes = c.bytes();
            if inner.list.len() < MAX_CANDIDATES {
                if self.take(bytes) {
                    let at = inner.list.len();
                    inner.index.insert(key, at);
                    inner.list.push(c);
                    inner.moved(at, ratio, period);
                }
            } else if let Some((low, r)) = inner.lowest(period) {
                let freed = inner.list[low].bytes();
                if ratio > r && self.take(bytes.saturating_sub(freed)) {
                    self.budget
                        .fetch_sub(freed.saturating_sub(bytes), Ordering::Relaxed);
                    let old = std::mem::replace(&mut inner.list[low], c);
                    inner.index.remove(&old.key);
                    inner.index.insert(key, low);
                    inner.rose(Low {
                        period,
                        at: low,
                        ratio: r,
                    });
                }
            }
        }
        self.set_floor(inner, period);
    }

    /// Takes `bytes` from the shared budget if it has room.
    fn take(&self, bytes: usize) -> bool {
        self.budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + bytes <= MAX_CANDIDATE_BYTES).then_some(used + bytes)
            })
            .is_ok()
    }

    fn set_floor(&self, inner: &mut Inner, period: u32) {
        // Below the cap any offer gets in: no floor, and no need to know the lowest.
        let full = inner.list.len() >= MAX_CANDIDATES;
        let floor = match if full { inner.lowest(period) } else { None } {
            Some((_, r)) => (u64::from(period) << 32) | u64::from((r as f32).to_bits()),
            None => 0,
        };
        self.floor.store(floor, Ordering::Relaxed);
    }

    /// The candidates held, for `/top` to re-read (a copy: the lock is not held while it
    /// reads the table).
    pub fn snapshot(&self) -> Vec<Candidate> {
        self.inner.lock().list.clone()
    }

    /// Drops the candidates whose entity `gone` says has left the table.
    pub fn forget(&self, gone: impl Fn(u128) -> bool) {
        let mut inner = self.inner.lock();
        let mut freed = 0;
        inner.list.retain(|c| {
            let keep = !gone(c.key);
            if !keep {
                freed += c.bytes();
            }
            keep
        });
        let index = (inner.list.iter().enumerate())
            .map(|(i, c)| (c.key, i))
            .collect();
        inner.index = index;
        inner.low = None;
        self.budget.fetch_sub(freed, Ordering::Relaxed);
        self.floor.store(0, Ordering::Relaxed);
    }

    /// How many candidates are held.
    pub fn len(&self) -> usize {
        self.inner.lock().list.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The position and ratio of the lowest candidate in `period` (older ones count 0).
fn lowest(list: &[Candidate], period: u32) -> Option<(usize, f64)> {
    list.iter()
        .enumerate()
        .map(|(i, c)| (i, c.ratio_at(period)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

#[cfg(test)]
#[path = "counts_tests.rs"]
mod tests;
