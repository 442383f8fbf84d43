//! One limit's state whatever its algorithm ([`LimitState`]: window counters or a token
//! bucket) and its sync plan ([`Plan`]): what the entity table holds and the sync task
//! drives, so neither needs to know which algorithm a limit uses.

use super::bucket::{BucketPlan, BucketState};
use super::clock::UnixMillis;
use super::fleet_view::FleetView;
use super::limit::{Algorithm, Limit, Verdict};
use super::window::{SyncPlan, WindowState};

/// The state of one limit of one entity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitState {
    /// A sliding or fixed window.
    Window(WindowState),
    /// A token bucket.
    Bucket(BucketState),
}

/// What an evicted limit's state must not forget (`table.rs` folds it into a sketch and a
/// returning entity starts from it, never from nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    /// A window's counts of `epoch - 1` and `epoch`.
    Window {
        /// The epoch read at the eviction.
        epoch: u64,
        /// The counts of the epoch before it and of it.
        counts: [u64; 2],
    },
    /// When a bucket is full again (Unix ms).
    Bucket {
        /// That time.
        full_at_ms: u64,
    },
}

/// What one sync of one limit sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// A window's deltas per epoch.
    Window(SyncPlan),
    /// A bucket's tokens spent.
    Bucket(BucketPlan),
}

impl Plan {
    /// Marks the plan a burst read (`window/prior.rs`).
    pub fn set_burst(&mut self, burst: bool) {
        match self {
            Plan::Window(p) => p.burst = burst,
            Plan::Bucket(p) => p.burst = burst,
        }
    }
}

// === impl LimitState ===

impl LimitState {
    /// What must outlive an eviction at `now`; `None` when a fresh state would decide the
    /// same (the window passed, the bucket is full, nothing waits to be sent).
    pub fn summary(&self, limit: &Limit, now: UnixMillis) -> Option<Summary> {
        match self {
            LimitState::Window(w) => w
                .summary(limit, now)
                .map(|(epoch, counts)| Summary::Window { epoch, counts }),
            LimitState::Bucket(b) => b
                .summary(now)
                .map(|full_at_ms| Summary::Bucket { full_at_ms }),
        }
    }

    /// A state for `limit` that starts from `summary` (an over-estimate of what an evicted
    /// entity held), or fresh (empty windows, a full bucket) when there is none or it is of
    /// another algorithm.
    pub fn restored(limit: &Limit, summary: Option<Summary>) -> Self {
        match (limit.algorithm, summary) {
            (Algorithm::TokenBucket { .. }, Some(Summary::Bucket { full_at_ms })) => {
                LimitState::Bucket(BucketState::restored(full_at_ms))
            }
            (Algorithm::TokenBucket { .. }, _) => LimitState::Bucket(BucketState::default()),
            (_, Some(Summary::Window { epoch, counts })) => {
                LimitState::Window(WindowState::restored(epoch, counts))
            }
            _ => LimitState::Window(WindowState::default()),
        }
    }

    /// Checks `hits` at `now` without counting them, knowing `fleet` of the other replicas.
    pub fn check_with(
        &mut self,
        limit: &Limit,
        now: UnixMillis,
        hits: u64,
        fleet: &FleetView,
    ) -> Verdict {
        match self {
            LimitState::Window(w) => w.check_with(limit, now, hits, fleet),
            LimitState::Bucket(b) => b.check_with(limit, now, hits, fleet),
        }
    }

    /// Counts `hits` at `now`.
    pub fn record_with(&mut self, limit: &Limit, now: UnixMillis, hits: u64, fleet: &FleetView) {
        match self {
            LimitState::Window(w) => w.record(limit, now, hits),
            LimitState::Bucket(b) => b.record_with(limit, now, hits, fleet),
        }
    }

    /// Gives `hits` back (`is_negative_hits`), knowing `fleet` (a young bucket's own prior
    /// gets them back too).
    pub fn refund_with(&mut self, limit: &Limit, now: UnixMillis, hits: u64, fleet: &FleetView) {
        match self {
            LimitState::Window(w) => w.refund(limit, now, hits),
            LimitState::Bucket(b) => b.refund_with(limit, now, hits, fleet),
        }
    }

    /// Starts a sync at `now`.
    pub fn begin_sync(&mut self, limit: &Limit, now: UnixMillis) -> Plan {
        match self {
            LimitState::Window(w) => Plan::Window(w.begin_sync(limit, now)),
            LimitState::Bucket(b) => Plan::Bucket(b.begin_sync()),
        }
    }

    /// Completes a sync with the store's `totals` for it, read at `now`.
    pub fn complete_sync(&mut self, limit: &Limit, plan: &Plan, totals: [u64; 2], now: UnixMillis) {
        match (self, plan) {
            (LimitState::Window(w), Plan::Window(p)) => w.complete_sync(limit, p, totals, now),
            (LimitState::Bucket(b), Plan::Bucket(p)) => b.complete_sync(limit, p, totals, now),
            _ => debug_assert!(false, "a plan of another algorithm"),
        }
    }

    /// Forgets the counts (an operator's reset): in local mode the state starts afresh; in
    /// global mode (`keep_unsent`) only the fleet's as last read goes
    /// ([`WindowState::forget`], [`BucketState::forget`]).
    pub fn forget(&mut self, keep_unsent: bool) {
        match self {
            LimitState::Window(w) => w.forget(keep_unsent),
            LimitState::Bucket(b) if keep_unsent => b.forget(),
            LimitState::Bucket(b) => *b = BucketState::default(),
        }
    }

    /// Abandons a sync that failed.
    pub fn fail_sync(&mut self, plan: &Plan) {
        match (self, plan) {
            (LimitState::Window(w), Plan::Window(p)) => w.fail_sync(p),
            (LimitState::Bucket(b), Plan::Bucket(p)) => b.fail_sync(p),
            _ => debug_assert!(false, "a plan of another algorithm"),
        }
    }

    /// The estimate at `now` as a share of the limit.
    pub fn pressure(&self, limit: &Limit, now: UnixMillis) -> f64 {
        match self {
            LimitState::Window(w) => w.pressure(limit, now),
            LimitState::Bucket(b) => b.pressure(limit, now),
        }
    }

    /// The pressure expected `ahead_ms` after `now`.
    pub fn pressure_ahead(
        &self,
        limit: &Limit,
        now: UnixMillis,
        ahead_ms: u64,
        min_span_ms: u64,
    ) -> f64 {
        match self {
            LimitState::Window(w) => w.pressure_ahead(limit, now, ahead_ms, min_span_ms),
            LimitState::Bucket(b) => b.pressure_ahead(limit, now, ahead_ms, min_span_ms),
        }
    }

    /// Whether the first reply is at least `tick_ms` old.
    pub fn settled(&self, tick_ms: u64) -> bool {
        match self {
            LimitState::Window(w) => w.settled(tick_ms),
            LimitState::Bucket(b) => b.settled(tick_ms),
        }
    }

    /// Whether the others' rate was measured between two replies.
    pub fn warm(&self) -> bool {
        match self {
            LimitState::Window(w) => w.warm(),
            LimitState::Bucket(b) => b.warm(),
        }
    }

    /// Whether a sync has ever completed.
    pub fn ever_synced(&self) -> bool {
        match self {
            LimitState::Window(w) => w.ever_synced(),
            LimitState::Bucket(b) => b.ever_synced(),
        }
    }

    /// Own hits not sent yet.
    pub fn pending(&self) -> i64 {
        match self {
            LimitState::Window(w) => w.pending(),
            LimitState::Bucket(b) => b.pending(),
        }
    }

    /// Whether this young entity has own hits not sent, which should go at once when its
    /// node denies it (`window/prior.rs`).
    pub fn wants_sync_when_denied(&self, fleet: &FleetView) -> bool {
        match self {
            LimitState::Window(w) => w.wants_sync_when_denied(fleet),
            LimitState::Bucket(_) => false,
        }
    }

    /// Whether this young entity has unsent hits enough to send before the next tick
    /// (`window/prior.rs`).
    pub fn wants_early_send(&self, limit: &Limit, fleet: &FleetView) -> bool {
        match self {
            LimitState::Window(w) => w.wants_early_send(limit, fleet),
            LimitState::Bucket(_) => false,
        }
    }

    /// Whether this entity should be re-read before the next tick: young, in a burst; settled,
    /// spending its share of the room in a surge (`window/prior.rs`, `bucket/burst.rs`).
    pub fn wants_burst_read(&self, limit: &Limit, now: UnixMillis, fleet: &FleetView) -> bool {
        match self {
            LimitState::Window(w) => w.wants_burst_read(limit, now, fleet),
            LimitState::Bucket(b) => b.wants_burst_read(limit, now, fleet),
        }
    }
}
