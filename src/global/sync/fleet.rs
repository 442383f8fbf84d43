//! What this replica knows of the fleet ([`Fleet`]): its id, the live replicas its
//! heartbeats count, the last drop and rise of that count, and the sync tick. Built once by
//! the wiring (`lib.rs`, the simulator, the benches) and handed to `global::spawn` (whose
//! heartbeats and join write it), to the limiter and to the quota service (which read it,
//! the limiter as a [`FleetView`] for each decision). It holds no queue and no table: the
//! hot path's queues are `queue.rs`'s.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::core::clock::UnixMillis;
use crate::core::FleetView;

/// This replica's knowledge of the fleet, shared by the sync (which writes it) and the
/// request paths (which read it). Atomics, not a lock: every field is read on the hot path,
/// and a decision made on a count one heartbeat old is as good as on the newest.
#[derive(Debug)]
pub struct Fleet {
    /// This replica's id, random per process start (`store::new_replica_id`), or the one the
    /// simulator numbers its replicas with, for runs that repeat exactly.
    replica: u64,
    /// Live replicas as the last heartbeat reply counted them (this one included).
    live: AtomicU32,
    /// The live count before its last drop, and when that drop was seen (Unix ms).
    live_before: AtomicU32,
    dropped_at: AtomicU64,
    /// The live count before its last rise, and when that rise was seen (Unix ms).
    before_rise: AtomicU32,
    rose_at: AtomicU64,
    /// The sync tick (ms), set by the shard tasks.
    tick_ms: AtomicU64,
}

impl Fleet {
    /// A replica alone so far (its heartbeats will tell), whose id is `replica`.
    pub fn new(replica: u64) -> Self {
        Fleet {
            replica,
            live: AtomicU32::new(1),
            live_before: AtomicU32::new(0),
            dropped_at: AtomicU64::new(0),
            before_rise: AtomicU32::new(0),
            rose_at: AtomicU64::new(0),
            tick_ms: AtomicU64::new(FleetView::ALONE.tick_ms),
        }
    }

    /// Live replicas (this one included) as the heartbeats last counted them; never below 1.
    pub fn live_replicas(&self) -> u32 {
        self.live.load(Ordering::Relaxed).max(1)
    }

    /// Sets the live count.
    pub fn set_live_replicas(&self, n: u32) {
        self.live.store(n.max(1), Ordering::Relaxed);
    }

    /// A heartbeat reply at `now` counted `n` live replicas: sets the count and, when it
    /// dropped or rose, remembers from what and when (after a drop, rates measured before
    /// are scaled down; after a rise, entities young before keep the prior of the count
    /// before: `core/window/prior.rs`).
    pub fn observe_live(&self, n: u32, now: UnixMillis) {
        let n = n.max(1);
        let old = self.live.swap(n, Ordering::Relaxed);
        if n < old {
            self.live_before.store(old, Ordering::Relaxed);
            self.dropped_at.store(now.0, Ordering::Relaxed);
        } else if n > old {
            self.before_rise.store(old, Ordering::Relaxed);
            self.rose_at.store(now.0, Ordering::Relaxed);
        }
    }

    /// What the hot path passes to the core about the fleet.
    pub fn view(&self) -> FleetView {
        FleetView {
            live: self.live_replicas(),
            tick_ms: self.tick_ms.load(Ordering::Relaxed),
            before: self.live_before.load(Ordering::Relaxed),
            dropped_at: self.dropped_at.load(Ordering::Relaxed),
            before_rise: self.before_rise.load(Ordering::Relaxed),
            rose_at: self.rose_at.load(Ordering::Relaxed),
        }
    }

    /// This replica's id: its heartbeat's member and its part of every counter.
    pub fn replica_id(&self) -> u64 {
        self.replica
    }

    pub(in crate::global) fn set_tick_ms(&self, tick_ms: u64) {
        self.tick_ms.store(tick_ms.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drop_and_a_rise_are_remembered_with_when_they_were_seen() {
        let fleet = Fleet::new(7);
        assert_eq!(fleet.view(), FleetView::ALONE);
        fleet.observe_live(4, UnixMillis(1_000));
        fleet.observe_live(2, UnixMillis(2_000));
        let v = fleet.view();
        assert_eq!((v.live, v.before, v.dropped_at), (2, 4, 2_000));
        assert_eq!((v.before_rise, v.rose_at), (1, 1_000));
        // A count of zero (a store that lost the heartbeats) is still this one replica.
        fleet.observe_live(0, UnixMillis(3_000));
        assert_eq!(fleet.live_replicas(), 1);
        assert_eq!(fleet.replica_id(), 7);
    }
}
