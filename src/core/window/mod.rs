//! Window counters: the state of one limit of one entity, and `check`/`record`/`refund`.
//! Global mode's additions to the same state live in its children: `sync.rs` (the
//! sync accounting), `share.rs` (the others' rate, the shared room, pressure) and `prior.rs`
//! (the prior and the burst reads); `held.rs` is the store's side of a node's part (how
//! Redis takes in a statement, refunds never past the count).
//!
//! No locks, no I/O, no clock reads: `now` is an argument, so every decision is reproducible
//! with a manual clock. Nothing here allocates.
//!
//! Two algorithms:
//! - **Sliding window** (default), the 2-epoch sliding window counter. With window `W`,
//!   `epoch = floor(now / W)` and `progress = (now mod W) / W`, the estimate is
//!   `floor(prev × (1 − progress)) + curr`.
//! - **Fixed window** (`algorithm: fixed_window`), envoyproxy/ratelimit's windows: a counter per
//!   epoch, reset at each boundary.
//! - **Concurrency** (`algorithm: concurrency`): the same two counters, counted whole,
//!   `prev + curr`: acquisitions in flight, each lapsing when its epoch leaves the window (one
//!   to two windows, the *lease*, after it was made). A refund (a release) takes from the
//!   previous epoch first, then the current one: the counters cannot tell acquisitions apart,
//!   and taking the oldest leaves the ones still counted in the newest epochs they could
//!   belong to, so no acquisition in flight lapses before its lease (taking the newest
//!   first, a release of an old acquisition would leave it counted in its old epoch, where it
//!   lapses early for the newer one still in flight). A release never takes the count below
//!   zero; one that comes after its acquisition lapsed frees another's place instead, one
//!   extra admission until that one lapses too (a lease longer than the longest request
//!   avoids it).
//!
//! In both, a request of `hits` is over the limit when `count + hits > limit` (the reference's
//! `count > limit` after its `INCRBY`); reaching the limit exactly is within it, and a limit
//! of 0 always denies. [`WindowState::check`] only looks; [`WindowState::record`] counts.
//! Whether denied hits are counted is the caller's choice (a rule's `strict`, in
//! `core/decide.rs`): a strict limit counts every hit, as the
//! reference's `INCRBY` does, and a lenient one only admitted ones.
//!
//! # Saturation
//! Counts saturate at [`MAX_COUNT`] (2^53 − 1) and never wrap: an addend too large for the
//! room left fills the slot to it. The bound keeps a node's own hits (`inflight + pending`)
//! far from `i64`'s end, every value exact in the Lua numbers (doubles) of the Redis script,
//! and a fleet's `INCRBY` far from Redis's own overflow error. Refunds never take a count
//! below zero.
//!

mod held;
mod prior;
mod share;
mod sync;

pub use held::Held;
pub use sync::{Part, SyncPlan};

use super::clock::UnixMillis;
use super::fleet_view::FleetView;
use super::limit::{Algorithm, Limit, Verdict, MAX_COUNT};

/// How a window's count takes the previous epoch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prev {
    /// Not at all: a fixed window (or epoch 0, which has none).
    Out,
    /// Weighted by the time left in the window: the sliding window.
    Decays,
    /// Whole: acquisitions in flight (`Concurrency`).
    Whole,
}

impl Prev {
    /// How `algorithm` takes the previous epoch's count (a bucket has none).
    pub fn of(algorithm: Algorithm) -> Prev {
        match algorithm {
            Algorithm::SlidingWindow => Prev::Decays,
            Algorithm::Concurrency => Prev::Whole,
            Algorithm::FixedWindow | Algorithm::TokenBucket { .. } => Prev::Out,
        }
    }
}

/// Counts of one epoch, split by where they are in the sync pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) epoch: u64,
    /// The fleet's count as Redis last reported it (own acknowledged hits included).
    pub(super) remote: u64,
    /// Own hits sent to Redis and not yet acknowledged.
    pub(super) inflight: i64,
    /// Own hits not yet sent.
    pub(super) pending: i64,
}

impl Slot {
    /// `remote + inflight + pending`, never below 0. Each part is within ±[`MAX_COUNT`]
    /// times a few (counts are capped there, refunds never take a total below 0), far inside
    /// i64: the sum needs no wider type (it runs several times a decision).
    #[inline]
    pub(super) fn total(&self) -> u64 {
        (self.remote as i64 + self.inflight + self.pending).max(0) as u64
    }
}

/// Counters of one limit of one entity: the current epoch and the one before it.
///
/// In local mode only `pending` ever moves and decisions are exact. In global mode a sync
/// moves `pending` to `inflight` ([`WindowState::begin_sync`]) and the reply moves it into
/// `remote` ([`WindowState::complete_sync`]), so a node's own hits are counted exactly once
/// whether or not a sync is in flight.
///
/// # Other nodes' hits between syncs
/// A node learns what the rest of the fleet did only from sync replies.
///
/// - **The room left is shared.** The *room* is the limit minus the fleet's count as last
///   read, minus the others' hits not yet sent when it was read (see below). A node admits
///   only while its own hits since that read fit in its *share* of the room: its part of the
///   window's count as of that read (own acknowledged hits over the fleet's count, weighted
///   as the window weighs them). When every node does this the fleet as a whole spends the
///   room about once, however stale the reads: no surge of many nodes each spending the same
///   room at the same moment, no drift during a Redis outage (the share and the count read
///   stay put while the window drains), and a node that takes most of the traffic gets most
///   of the room. Being measured, shares need no count of live replicas and follow uneven
///   load; nor must they add up to exactly 1, because every read resets the room to the
///   truth (too large a sum shows as a count a little over the limit, too small as room left
///   unused until the next read). Two details keep small shares from wasting room: a node
///   takes its share of the room as it will be at its next read (in a sliding window, more of
///   the previous epoch will have drained out by then), and rounds it with an offset of its
///   own. Until its first read is a tick old a node keeps instead to its prior share of the
///   limit, from the count of live replicas (`prior.rs`); alone, it has the whole room.
/// - **The others' rate is measured** between consecutive replies, over both epochs (so a
///   boundary in between loses nothing). It gives the estimate the node reports
///   (`count_after`, `remaining`) and the pressure that sets its sync tier: the count read
///   plus the rate times the time since, in the previous epoch up to its end and in the
///   current one since its start. It also sizes the others' hits not yet sent when the count
///   was read: they sync about as often as this node (the last gap between its replies), so
///   those hits are half a gap old on average. A first reply gives only a guess at the rate
///   (the others' hits since the epoch began); it counts as measured ([`WindowState::warm`])
///   from the second, and until then [`SyncPolicy::due`] syncs the entity every tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowState {
    pub(super) slots: [Slot; 2],
    /// Own hits counted in each slot's epoch (acknowledged or not), less own refunds: the sum
    /// of every delta this node made to the epoch's counter, so `own − inflight − pending` is
    /// its acknowledged part (for the share, and restored after Redis restarts empty). Signed:
    /// a node may refund hits another node counted. Kept apart from `Slot` so the state stays
    /// small: an i32 would pad a slot to 40 bytes.
    pub(super) own: [i32; 2],
    /// Own refunds in each slot's epoch (saturating): with `own` they give what a sync states
    /// to the store, this node's hits and refunds so far, both only ever growing
    /// ([`SyncPlan::parts`](sync::SyncPlan::parts)).
    pub(super) refunded: [u32; 2],
    /// When the last sync reply arrived (Unix ms); 0 before the first.
    pub(super) synced_at: u64,
    /// Other nodes' hits per second between the last two replies (after one reply: a guess).
    pub(super) others_per_sec: f32,
    /// The time between replies (ms, saturating), following a shorter gap at once and a
    /// longer one slowly; 0 until there were two replies.
    pub(super) gap_ms: u16,
    /// Time from the first reply to the last (ms, saturating): until it reaches a tick the
    /// count read may not show the others' hits yet, and the prior still holds (`prior.rs`).
    pub(super) age_ms: u16,
}

/// `floor(prev × left / w)`, in u64 unless that overflows.
#[inline]
pub(super) fn weigh(prev: u64, left: u64, w: u64) -> u64 {
    // Most previous epochs of a busy table are empty: no division then (a 64-bit division
    // is a good part of a decision that runs in a couple of hundred nanoseconds).
    if prev == 0 {
        return 0;
    }
    match prev.checked_mul(left) {
        Some(p) => p / w,
        None => (u128::from(prev) * u128::from(left) / u128::from(w)) as u64,
    }
}

/// `x` as f64 through i64: one instruction on the baseline x86-64 target, where u64's
/// conversion takes a dozen. Counts (at most [`MAX_COUNT`]) and times are far below 2^63;
/// anything past it saturates.
#[inline]
pub(super) fn float(x: u64) -> f64 {
    x.min(i64::MAX as u64) as i64 as f64
}

/// What a decision at `now` on the counts of `epoch` (`now`'s, or a later one after a clock
/// step back) reads besides the state, worked out once per decision.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) epoch: u64,
    /// When the epoch starts (Unix ms, saturating).
    pub(super) start_ms: u64,
    /// The time left in the window ([`left_ms`]).
    pub(super) left_ms: u64,
    window_ms: u64,
    /// How the previous epoch's count is in the window (none at epoch 0).
    prev: Prev,
}

impl Span {
    #[inline]
    pub(super) fn new(limit: &Limit, now: UnixMillis, epoch: u64) -> Self {
        Span {
            epoch,
            start_ms: epoch.saturating_mul(limit.window_ms),
            left_ms: left_ms(limit, now, epoch),
            window_ms: limit.window_ms,
            prev: if epoch == 0 {
                Prev::Out
            } else {
                Prev::of(limit.algorithm)
            },
        }
    }

    /// The window formula over the counts of `epoch - 1` and `epoch`: `floor(prev × left /
    /// W) + curr` in a sliding window, `prev + curr` for concurrency, `curr` otherwise.
    #[inline]
    pub(super) fn count(&self, prev: u64, curr: u64) -> u64 {
        match self.prev {
            Prev::Decays => weigh(prev, self.left_ms, self.window_ms) + curr,
            Prev::Whole => prev.saturating_add(curr),
            Prev::Out => curr,
        }
    }

    /// How much of the previous epoch's count is still in the window (`left / W`; all of it
    /// for concurrency; 0 in a fixed window, a bucket, or epoch 0, which has none).
    #[inline]
    pub(super) fn weight(&self) -> f64 {
        match self.prev {
            Prev::Decays => float(self.left_ms) / float(self.window_ms),
            Prev::Whole => 1.0,
            Prev::Out => 0.0,
        }
    }
}

// === impl WindowState ===

impl WindowState {
    pub(super) fn count(&self, epoch: u64) -> u64 {
        let s = &self.slots[(epoch % 2) as usize];
        if s.epoch == epoch {
            s.total()
        } else {
            0
        }
    }

    #[inline]
    pub(super) fn newest_epoch(&self) -> u64 {
        self.slots[0].epoch.max(self.slots[1].epoch)
    }

    /// The slot of `epoch`, reset when it still holds an older epoch. A clock that stepped
    /// back gets the newest slot, so counts are kept rather than forgotten.
    #[inline]
    pub(super) fn slot_mut(&mut self, epoch: u64) -> &mut Slot {
        let epoch = epoch.max(self.newest_epoch());
        let i = (epoch % 2) as usize;
        if self.slots[i].epoch < epoch {
            self.reset(i, epoch);
        }
        &mut self.slots[i]
    }

    /// Opens slot `i` for `epoch`. Anything still there is two windows old: no estimate
    /// reads it any more.
    #[inline]
    pub(super) fn reset(&mut self, i: usize, epoch: u64) {
        self.slots[i] = Slot {
            epoch,
            ..Slot::default()
        };
        self.own[i] = 0;
        self.refunded[i] = 0;
    }

    /// The epoch an estimate at `now` reads. A clock that stepped back reads the newest counts
    /// rather than none.
    pub(super) fn epoch_at(&self, limit: &Limit, now: UnixMillis) -> u64 {
        (now.0 / limit.window_ms).max(self.newest_epoch())
    }

    /// The window formula at `now` over the counts of `epoch - 1` and `epoch`.
    pub(super) fn window(limit: &Limit, now: UnixMillis, epoch: u64, prev: u64, curr: u64) -> u64 {
        Span::new(limit, now, epoch).count(prev, curr)
    }

    /// Per-epoch values of `epoch - 1` and `epoch` read through `f`, 0 (the default) for an
    /// epoch no slot holds.
    #[inline]
    pub(super) fn pair<T: Default>(&self, epoch: u64, f: impl Fn(usize, &Slot) -> T) -> (T, T) {
        let at = |e: u64| {
            let i = (e % 2) as usize;
            if self.slots[i].epoch == e {
                f(i, &self.slots[i])
            } else {
                T::default()
            }
        };
        let prev = if epoch == 0 {
            T::default()
        } else {
            at(epoch - 1)
        };
        (prev, at(epoch))
    }

    /// Checks `hits` at `now` without counting them.
    ///
    /// In local mode (never synced) the count is exact. In global mode `over` says whether
    /// the hits fit in this node's share of the room left, while `count_after` and
    /// `remaining` report the fleet's estimated count (see [`WindowState`]).
    #[inline]
    pub fn check(&mut self, limit: &Limit, now: UnixMillis, hits: u64) -> Verdict {
        self.check_with(limit, now, hits, &FleetView::ALONE)
    }

    /// [`WindowState::check`] in a fleet: `fleet` is what this node knows of the others (the
    /// live replicas, the tick, a recent departure). Until the fleet's count is known the
    /// node keeps to its prior share of the limit (see `prior.rs`).
    #[inline]
    pub fn check_with(
        &mut self,
        limit: &Limit,
        now: UnixMillis,
        hits: u64,
        fleet: &FleetView,
    ) -> Verdict {
        // `now`'s epoch and what follows from it need no state: computed before the state is
        // read (on a busy table, a cache miss), they are ready when it arrives. The state's
        // own epoch is later only after a clock step back.
        let now_epoch = now.0 / limit.window_ms;
        let mut span = Span::new(limit, now, now_epoch);
        if self.newest_epoch() > now_epoch {
            span = Span::new(limit, now, self.newest_epoch());
        }
        // The counts, and the fleet's as last read, in one pass over the slots.
        let ((prev, read_prev), (curr, read_curr)) =
            self.pair(span.epoch, |_, s| (s.total(), s.remote));
        let rpu = u64::from(limit.requests_per_unit);
        let after = span.count(prev, curr).saturating_add(hits);
        let (count_after, over_room) = if self.synced_at == 0 {
            (after, after > rpu)
        } else {
            let factor = fleet.rate_factor(self.synced_at);
            // A young entity keeps to its prior (below) rather than to a share measured on
            // a count that does not show the others' hits yet.
            let over_room = after > rpu
                || !self.young(fleet)
                    && self.over_room_share(
                        (limit, now, &span, fleet),
                        factor,
                        (read_prev, read_curr),
                        after,
                    );
            (
                self.estimate_on(limit, now, &span, factor, (prev, curr))
                    .saturating_add(hits),
                over_room,
            )
        };
        let over = rpu == 0 || over_room || self.over_prior(limit, now, span.epoch, hits, fleet);
        Verdict {
            count_after,
            over,
            remaining: if over {
                0
            } else {
                rpu.saturating_sub(count_after) as u32
            },
            reset_ms: span.left_ms,
            retry_ms: if over { span.left_ms } else { 0 },
        }
    }

    /// Counts `hits` at `now`, up to [`MAX_COUNT`] in the slot.
    #[inline]
    pub fn record(&mut self, limit: &Limit, now: UnixMillis, hits: u64) {
        let s = self.slot_mut(now.0 / limit.window_ms);
        // At most MAX_COUNT < 2^53: the cast is exact and no sum of in-flight and pending hits
        // overflows.
        let add = hits.min(MAX_COUNT.saturating_sub(s.total())) as i64;
        s.pending += add;
        let i = (s.epoch % 2) as usize;
        self.own[i] = self.own[i].saturating_add(add.min(i64::from(i32::MAX)) as i32);
    }

    /// Gives `hits` back to the current window (Envoy's `is_negative_hits`), never taking the
    /// count below zero; a concurrency limit's release takes from the previous epoch first
    /// (see the module docs).
    pub fn refund(&mut self, limit: &Limit, now: UnixMillis, hits: u64) {
        let epoch = self.slot_mut(now.0 / limit.window_ms).epoch;
        let mut left = hits;
        if limit.algorithm == Algorithm::Concurrency && epoch > 0 {
            left -= self.give_back(epoch - 1, left);
        }
        self.give_back(epoch, left);
    }

    /// Takes up to `hits` off the count of `epoch` (nothing when no slot holds it), never
    /// below zero; returns how many.
    fn give_back(&mut self, epoch: u64, hits: u64) -> u64 {
        let i = (epoch % 2) as usize;
        let s = &mut self.slots[i];
        if s.epoch != epoch {
            return 0;
        }
        // `min` before the cast, so a refund of 2^63 or more never becomes a negative number
        // (which would add hits). In global mode the negative delta reaches Redis too.
        let back = i64::try_from(hits.min(s.total())).unwrap_or(i64::MAX);
        s.pending = s.pending.saturating_sub(back);
        // Not clamped at 0: the counter's part of this node goes down by `back` in Redis too.
        let part = back.clamp(0, i64::from(i32::MAX)) as i32;
        self.own[i] = self.own[i].saturating_sub(part);
        self.refunded[i] = self.refunded[i].saturating_add(part as u32);
        back as u64
    }

    /// Hits counted in the current epoch, as this node sees them (before extrapolation).
    pub fn current_count(&mut self, limit: &Limit, now: UnixMillis) -> u64 {
        self.count(now.0 / limit.window_ms)
    }

    /// Own hits not yet sent, over both epochs.
    pub fn pending(&self) -> i64 {
        self.slots.iter().map(|s| s.pending).sum()
    }

    /// Forgets the counts (an operator's reset, `rls/reset.rs`). In local mode
    /// (`keep_unsent` false) the state starts afresh. In global mode only the fleet's count
    /// as last read goes: this node's own hits and refunds so far stay, because each sync
    /// states them whole and the store keeps the larger (a smaller statement would be
    /// ignored until it grew past the old one), and its hits not acknowledged yet stay too,
    /// because they reach the store after the reset and count there as well.
    pub fn forget(&mut self, keep_unsent: bool) {
        if !keep_unsent {
            *self = WindowState::default();
            return;
        }
        for s in &mut self.slots {
            s.remote = 0;
        }
    }

    /// What an evicted entity must not forget (`table.rs`): the counts of the epoch read at
    /// `now` and of the one before it, as `(epoch, [previous, current])`; `None` when the
    /// window's count is 0, so a fresh state would decide the same. (Hits not sent yet are
    /// the sync's to keep: the table never evicts an entity a sync holds.)
    pub fn summary(&self, limit: &Limit, now: UnixMillis) -> Option<(u64, [u64; 2])> {
        let epoch = self.epoch_at(limit, now);
        let (prev, curr) = self.pair(epoch, |_, s| s.total());
        (Self::window(limit, now, epoch, prev, curr) > 0).then_some((epoch, [prev, curr]))
    }

    /// A state that counts at least `counts` (previous, current) in `epoch` and the one
    /// before it: a returning entity's over-estimate. The counts go where the store's would,
    /// so in global mode they are never sent as this node's hits, and a reply raises them to
    /// the fleet's.
    pub fn restored(epoch: u64, counts: [u64; 2]) -> Self {
        let mut w = WindowState::default();
        for (e, count) in [(epoch.checked_sub(1), counts[0]), (Some(epoch), counts[1])] {
            if let Some(e) = e.filter(|_| count > 0) {
                w.slots[(e % 2) as usize] = Slot {
                    epoch: e,
                    remote: count.min(MAX_COUNT),
                    ..Slot::default()
                };
            }
        }
        w
    }
}

/// The time left in the window of `now` (ms), `epoch` being `now`'s epoch or a later one (a
/// clock that stepped back): the remainder from the epoch's start, without a division, when
/// `now` is in it.
#[inline]
pub(super) fn left_ms(limit: &Limit, now: UnixMillis, epoch: u64) -> u64 {
    let w = limit.window_ms;
    match now.0.checked_sub(epoch.wrapping_mul(w)) {
        Some(into) if into < w => w - into,
        _ => w - now.0 % w,
    }
}

/// The window count at `now` of a store's counters `prev` (epoch − 1) and `curr` (the
/// current epoch): the limit's own formula (`floor(prev × left / W) + curr` for the sliding
/// window, `curr` for the fixed one). Exact rules decide with it from Redis's counts.
pub fn window_count(limit: &Limit, now: UnixMillis, prev: u64, curr: u64) -> u64 {
    WindowState::window(limit, now, now.0 / limit.window_ms, prev, curr)
}

#[cfg(test)]
mod tests;
