//! One shard of the entity table: its records in densely packed chunks that never move
//! ([`Record`]), the open-addressing index of their 4-byte positions, and its sketch of
//! evicted entities.

use hashbrown::HashTable;

use super::sketch::Sketch;
use super::{secs, EntityState};
use crate::core::clock::UnixMillis;
use crate::core::limit::Limit;

/// Records per chunk: chunks are never reallocated, so growing a shard copies nothing and
/// its memory is what its records use, plus at most one partly filled chunk.
const CHUNK_BITS: usize = 8;
const CHUNK: usize = 1 << CHUNK_BITS;

/// One entity.
#[derive(Debug)]
pub(super) struct Record {
    /// The key's two halves (not a `u128`: its 16-byte alignment would pad every record).
    pub(super) key: [u64; 2],
    pub(super) set: u32,
    /// Last use (Unix seconds): the eviction's recency, the sweep's idleness.
    pub(super) used_s: u32,
    pub(super) state: EntityState,
}

impl Record {
    pub(super) fn key(&self) -> u128 {
        (u128::from(self.key[1]) << 64) | u128::from(self.key[0])
    }

    /// Whether forgetting it changes no decision at `now`: every window passed, every bucket
    /// full.
    pub(super) fn holds_nothing(&self, limits: &[Limit], now: UnixMillis) -> bool {
        self.state
            .states
            .iter()
            .zip(limits)
            .all(|(s, l)| s.summary(l, now).is_none())
    }
}

/// The record at position `pos` of a shard's chunks.
fn record_at(chunks: &[Vec<Record>], pos: usize) -> &Record {
    &chunks[pos >> CHUNK_BITS][pos & (CHUNK - 1)]
}

/// The index's hash of the record at `pos`, for the index's rehashing.
fn hash_at(chunks: &[Vec<Record>], pos: u32) -> u64 {
    hash_of(record_at(chunks, pos as usize).key())
}

/// The index's hash of a key: the entity key is already a hash (XXH3-128); its low half
/// places it in the shard, its high half picks the shard.
fn hash_of(key: u128) -> u64 {
    key as u64
}

pub(super) struct Shard {
    pub(super) index: HashTable<u32>,
    pub(super) chunks: Vec<Vec<Record>>,
    pub(super) len: usize,
    /// Where the next eviction sample starts.
    pub(super) hand: usize,
    /// Where the sweep goes on.
    pub(super) sweep: usize,
    /// Allocated at the first eviction of a live entity.
    pub(super) sketch: Option<Box<Sketch>>,
}

impl Shard {
    pub(super) fn new() -> Self {
        Shard {
            index: HashTable::new(),
            chunks: Vec::new(),
            len: 0,
            hand: 0,
            sweep: 0,
            sketch: None,
        }
    }

    pub(super) fn at(&self, pos: usize) -> &Record {
        record_at(&self.chunks, pos)
    }

    pub(super) fn at_mut(&mut self, pos: usize) -> &mut Record {
        &mut self.chunks[pos >> CHUNK_BITS][pos & (CHUNK - 1)]
    }

    pub(super) fn find(&self, key: u128) -> Option<usize> {
        let chunks = &self.chunks;
        self.index
            .find(hash_of(key), |&p| {
                record_at(chunks, p as usize).key() == key
            })
            .map(|&p| p as usize)
    }

    pub(super) fn push(&mut self, record: Record) -> usize {
        let pos = self.len;
        let hash = hash_of(record.key());
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks
            .last_mut()
            .expect("a chunk with room")
            .push(record);
        self.len += 1;
        let chunks = &self.chunks;
        self.index
            .insert_unique(hash, pos as u32, |&p| hash_at(chunks, p));
        pos
    }

    /// Removes the record at `pos`; the last record takes its place.
    pub(super) fn remove(&mut self, pos: usize) -> Record {
        let last = self.len - 1;
        let hash = hash_of(self.at(pos).key());
        if let Ok(entry) = self.index.find_entry(hash, |&p| p as usize == pos) {
            entry.remove();
        }
        if pos != last {
            let moved = hash_of(self.at(last).key());
            if let Some(p) = self.index.find_mut(moved, |&p| p as usize == last) {
                *p = pos as u32;
            }
        }
        let tail = self.chunks.last_mut().expect("a record to remove");
        let mut record = tail.pop().expect("a record to remove");
        if tail.is_empty() {
            self.chunks.pop();
        }
        self.len -= 1;
        if pos != last {
            record = std::mem::replace(self.at_mut(pos), record);
        }
        if self.index.capacity() > 64 && self.index.len() < self.index.capacity() / 4 {
            let chunks = &self.chunks;
            self.index.shrink_to_fit(|&p| hash_at(chunks, p));
        }
        record
    }

    /// Folds what `record` still counts into the sketch.
    pub(super) fn fold(
        &mut self,
        record: &Record,
        limits: &[Limit],
        now: UnixMillis,
        width: usize,
    ) {
        let key = record.key();
        let now_s = secs(now);
        for (i, (state, limit)) in record.state.states.iter().zip(limits).enumerate() {
            if let Some(summary) = state.summary(limit, now) {
                self.sketch
                    .get_or_insert_with(|| Box::new(Sketch::new(width)))
                    .fold(key, i, limit, summary, now_s);
            }
        }
    }
}
