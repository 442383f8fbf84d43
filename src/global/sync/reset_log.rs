//! The fleet's reset log: how a replica learns of an operator's reset (`POST /reset`, made
//! through another replica) for a key it gets no request for.
//!
//! A reset clears the store's counters (`global/exact/reset.rs`), and then appends one entry
//! per entity to a capped log in the entity's shard: a fleet-wide sequence number (one past
//! the newest entry's) and the entity ([`ResetLog::append`]; `reset_log.lua` on Redis, the
//! list `{prefix}sluice:resets`). Every tick's heartbeat also reads the entries after the
//! last one this replica has seen ([`ResetRead`], at most [`MAX_RESETS_PER_BEAT`]), and the
//! shard task forgets those entities' fleet counts as last read and queues them, so the next
//! tick reads the store's ([`ResetCursor`], `shard.rs`): a replica's view of a reset key is
//! cleared within a tick of the reset whether or not it gets requests for it. Its own hits
//! not sent yet are kept, as on the replica asked (`rls/reset.rs` says why).
//!
//! Bounds: the log holds at most `RESET_LOG_LENGTH` entries (older ones are trimmed), each
//! of at most [`MAX_ENTRY_BYTES`]; a heartbeat reads at most [`MAX_RESETS_PER_BEAT`] of them,
//! and a replica further behind reads the rest at its next ticks.
//!
//! A replica that was cut off from the store while more resets than the log holds were made
//! finds the entries after its own trimmed: it cannot tell which keys they reset. It counts
//! them as missed (`sluice_reset_log_missed_total`), logs a warning, and goes on from the
//! oldest entry the log still holds. The keys it missed are cleared as they were before the
//! log existed: at its next sync of each, i.e. within a tick of its next request for it (the
//! first of those may be denied). Nothing is ever admitted because of a miss: a missed reset
//! only leaves a view higher than the store's, and the store's count is never brought back.
//!
//! A log that is behind the replica (the store lost its keys: a Redis restarted empty) starts
//! again at 1: every entry it holds is read as new. A replica that finds the store lost its
//! keys (its generation changed, `health.rs`) reads the log from its start too, in case the
//! new log already holds more entries than it had read of the old one.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The most entries one heartbeat reads: bounds a tick's work (a table lookup each) and the
/// heartbeat's reply (about 40 bytes an entry).
pub const MAX_RESETS_PER_BEAT: u64 = 256;

/// `RESET_LOG_LENGTH`'s default: the most entries a shard's log keeps.
pub const DEFAULT_RESET_LOG_LENGTH: usize = 10_000;

/// `RESET_LOG_LENGTH`'s most: 1,000,000 entries of at most [`MAX_ENTRY_BYTES`], about 53 MB
/// of Redis memory per shard at worst.
pub const MAX_RESET_LOG_LENGTH: usize = 1_000_000;

/// The most bytes of one entry on Redis: a sequence number (at most 16 digits: sequence
/// numbers stay below 2^53, where a Lua number is exact), a space and the entity (32 hex
/// digits).
pub const MAX_ENTRY_BYTES: usize = 16 + 1 + 32;

/// How a heartbeat reads the reset log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ResetRead {
    /// Not at all (a replica joining the fleet).
    #[default]
    Skip,
    /// Where the log is, no entry: a replica's first read (nothing it holds predates it).
    Head,
    /// The entries after this sequence number, oldest first.
    After(u64),
}

/// What a heartbeat's read of the reset log answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetNews {
    /// The newest entry's sequence number (0: the log is empty).
    pub head: u64,
    /// The sequence number of `entities[0]` (the next ones follow it).
    pub first: u64,
    /// The entities reset, oldest first: at most [`MAX_RESETS_PER_BEAT`].
    pub entities: Vec<u128>,
    /// Entries after the reader's that the log no longer holds.
    pub missed: u64,
}

/// Which entries a read answers of a log whose newest entry is `head` and which holds `len`:
/// `(first, last, missed)`, `first..=last` (empty when `first > last`). `reset_log.lua` does
/// the same arithmetic.
pub fn span(head: u64, len: u64, read: ResetRead) -> (u64, u64, u64) {
    let after = match read {
        ResetRead::Skip | ResetRead::Head => return (head + 1, head, 0),
        // A log behind the reader started again: all it holds is new.
        ResetRead::After(after) if after > head => 0,
        ResetRead::After(after) => after,
    };
    let oldest = (head + 1).saturating_sub(len.min(head));
    let first = (after + 1).max(oldest);
    let last = head.min(first + MAX_RESETS_PER_BEAT - 1);
    (first, last, first - (after + 1))
}

/// The reset log of one shard: the in-memory twin of `reset_log.lua`.
#[derive(Debug, Default)]
pub struct ResetLog {
    /// The newest entry's sequence number.
    head: u64,
    /// The entities of entries `head - len + 1 ..= head`, oldest first.
    entries: std::collections::VecDeque<u128>,
}

impl ResetLog {
    /// Appends an entry per entity and trims the log to its newest `max_len` (at least 1).
    /// Returns the newest entry's sequence number.
    pub fn append(&mut self, entities: &[u128], max_len: usize) -> u64 {
        for &e in entities {
            self.head += 1;
            self.entries.push_back(e);
        }
        while self.entries.len() > max_len.max(1) {
            self.entries.pop_front();
        }
        self.head
    }

    /// The entries `read` asks for ([`span`]).
    pub fn read(&self, read: ResetRead) -> ResetNews {
        let len = self.entries.len() as u64;
        let (first, last, missed) = span(self.head, len, read);
        let oldest = self.head + 1 - len;
        let entities = (first..=last)
            .map(|seq| self.entries[(seq - oldest) as usize])
            .collect();
        ResetNews {
            head: self.head,
            first,
            entities,
            missed,
        }
    }

    /// Forgets every entry, as a store that lost its keys does.
    pub fn clear(&mut self) {
        *self = ResetLog::default();
    }
}

/// A shard's place in its reset log, and what it took in: kept with the shard's health.
#[derive(Debug, Default)]
pub struct ResetCursor {
    /// The newest entry read; `None` before the first read.
    seen: Mutex<Option<u64>>,
    /// The store lost its keys: the read under way asked for the old log's place, so its
    /// answer is dropped and the next read starts from the new log's start.
    lost: std::sync::atomic::AtomicBool,
    applied: AtomicU64,
    missed: AtomicU64,
}

impl ResetCursor {
    /// What the next heartbeat reads.
    pub fn read(&self) -> ResetRead {
        match *self.seen.lock() {
            None => ResetRead::Head,
            Some(seen) => ResetRead::After(seen),
        }
    }

    /// Takes in a read's answer: returns the entities to clear (none on the first read, whose
    /// answer is where the log is), and counts what was missed.
    pub fn take(&self, news: ResetNews) -> Vec<u128> {
        let mut seen = self.seen.lock();
        if self.lost.swap(false, Ordering::Relaxed) {
            return Vec::new();
        }
        let Some(before) = *seen else {
            *seen = Some(news.head);
            return Vec::new();
        };
        *seen = Some(if news.entities.is_empty() {
            news.head
        } else {
            news.first + news.entities.len() as u64 - 1
        });
        if news.missed > 0 {
            self.missed.fetch_add(news.missed, Ordering::Relaxed);
            tracing::warn!(
                missed = news.missed,
                seen = before,
                oldest = news.first,
                "resets were trimmed from the reset log before this replica read them; \
                 their keys are cleared at their next sync"
            );
        }
        self.applied
            .fetch_add(news.entities.len() as u64, Ordering::Relaxed);
        news.entities
    }

    /// The store lost its keys (its log too): the next read starts from the log's start, and
    /// the answer of the read under way, read from the old place, is dropped.
    pub fn store_lost(&self) {
        let mut seen = self.seen.lock();
        if seen.is_some() {
            *seen = Some(0);
            self.lost.store(true, Ordering::Relaxed);
        }
    }

    /// Entries taken in so far.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// Entries missed so far (trimmed before this replica read them).
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(n: u128, max_len: usize) -> ResetLog {
        let mut l = ResetLog::default();
        let all: Vec<u128> = (1..=n).collect();
        l.append(&all, max_len);
        l
    }

    #[test]
    fn a_read_answers_the_entries_after_the_readers_oldest_first() {
        let l = log(5, 100);
        let news = l.read(ResetRead::After(2));
        assert_eq!(
            news,
            ResetNews {
                head: 5,
                first: 3,
                entities: vec![3, 4, 5],
                missed: 0
            }
        );
        assert!(l.read(ResetRead::After(5)).entities.is_empty());
        let head = l.read(ResetRead::Head);
        assert_eq!((head.head, head.entities.len()), (5, 0));
    }

    #[test]
    fn entries_trimmed_past_the_reader_are_counted_missed() {
        // 10 appended, 4 kept: 7..=10.
        let l = log(10, 4);
        let news = l.read(ResetRead::After(3));
        assert_eq!((news.first, news.missed), (7, 3));
        assert_eq!(news.entities, vec![7, 8, 9, 10]);
        // A reader at the trim's edge misses nothing.
        assert_eq!(l.read(ResetRead::After(6)).missed, 0);
    }

    #[test]
    fn a_read_takes_at_most_its_bound_and_the_rest_next_time() {
        let l = log(600, 1000);
        let c = ResetCursor::default();
        *c.seen.lock() = Some(0);
        let first = c.take(l.read(c.read()));
        assert_eq!(first.len() as u64, MAX_RESETS_PER_BEAT);
        assert_eq!(c.read(), ResetRead::After(MAX_RESETS_PER_BEAT));
        let mut all = first;
        while let ResetRead::After(s) = c.read() {
            if s == 600 {
                break;
            }
            all.extend(c.take(l.read(c.read())));
        }
        assert_eq!(all, (1..=600).collect::<Vec<u128>>());
        assert_eq!((c.applied(), c.missed()), (600, 0));
    }

    #[test]
    fn a_first_read_clears_nothing_and_starts_at_the_head() {
        let mut l = log(3, 10);
        let c = ResetCursor::default();
        assert!(c.take(l.read(c.read())).is_empty());
        l.append(&[42], 10);
        assert_eq!(c.take(l.read(c.read())), vec![42]);
    }

    #[test]
    fn a_log_behind_the_reader_started_again_and_is_read_whole() {
        let c = ResetCursor::default();
        *c.seen.lock() = Some(50);
        let mut l = ResetLog::default();
        l.append(&[7, 8], 10);
        assert_eq!(c.take(l.read(c.read())), vec![7, 8]);
        assert_eq!(c.read(), ResetRead::After(2));
    }

    #[test]
    fn a_store_that_lost_its_keys_has_its_new_log_read_from_its_start() {
        let c = ResetCursor::default();
        *c.seen.lock() = Some(3);
        // Restarted empty, the store's new log holds 5 when the replica reads it next.
        let l = log(5, 10);
        let news = l.read(c.read());
        assert_eq!(news.entities, vec![4, 5]);
        // The same heartbeat tells the store lost its keys: its answer is dropped, and the
        // next read takes the whole new log.
        c.store_lost();
        assert!(c.take(news).is_empty());
        assert_eq!(c.read(), ResetRead::After(0));
        assert_eq!(c.take(l.read(c.read())), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_reader_cut_off_past_the_log_counts_the_miss_and_goes_on() {
        let c = ResetCursor::default();
        *c.seen.lock() = Some(1);
        let l = log(20, 5);
        assert_eq!(c.take(l.read(c.read())), vec![16, 17, 18, 19, 20]);
        assert_eq!(c.missed(), 14);
        assert_eq!(c.read(), ResetRead::After(20));
    }
}
