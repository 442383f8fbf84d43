//! The narrow interface to the shared store ([`ShardStore`]): one call per shard per tick
//! states this replica's parts of the counters and returns the totals. Redis implements it
//! (`global/redis/sync.rs`), and so does the in-memory store (`global/memory/`) that tests and the simulator
//! use.
//!
//! A counter of (entity, limit, epoch) has one part per replica, and its total is their sum.
//! A call states a replica's part whole — its hits and its refunds so far ([`Part`]), both
//! only ever growing — and the store keeps, of each, the larger of what it holds and what the
//! call says. So a call is idempotent: one that timed out but ran and is then sent again, a
//! late duplicate, or two applied out of order count each hit once; and a store that
//! restarted empty gets back what the live replicas counted. Refunds the store has not seen
//! are applied once, as far as the count holds hits, and the rest kept out
//! (`core/window/held.rs`): two replicas giving back the same hits free them once, and a
//! count never goes below zero. Replicas are told apart by a
//! random id per process start ([`new_replica_id`]): a restarted replica is a new one, and
//! the part of the old one stays as it was.
//!
//! Every call is one [`ShardStore::round_trip`] carrying a [`Trip`]. The tick's also refreshes
//! this replica's heartbeat, which returns how many replicas
//! are live; a replica joining the fleet also reads the set itself ([`ShardStore::replicas`]).
//! The heartbeat also reads the store's *generation* ([`Beat::generation`]): a random number
//! the first replica to find none writes, with no expiry. Each replica remembers the one it
//! read; a store that answers another has lost the sync's keys (a Redis restarted empty,
//! flushed or replaced), and the replica says so (`health.rs`). A fresh fleet finds none and
//! remembers nothing to compare with, so it never mistakes that for a loss; and counters
//! expiring leave the generation alone.
//!
//! An operator's reset (`POST /reset`) adds to a counter a part of the store's own, minus
//! its count, read as refunds the store applied: no replica's statement or floor brings the
//! count back (`global/exact/reset.rs`; `MemoryStore::reset_window` here, `reset.lua` on
//! Redis). It also appends the entity to the shard's reset log, which the heartbeat reads,
//! so an idle replica clears its view within a tick (`reset_log.rs`).
//!
//! Apart from the counters, a trip's [`Publish`] publishes how many RLQS streams this
//! replica holds on each counter, and their demand, and returns what the other live replicas
//! published (`global/presence.rs` calls it once a tick per shard).

use std::future::Future;
use std::time::Duration;

use crate::core::bucket::Geometry;
use crate::core::clock::UnixMillis;
use crate::core::Part;
use crate::core::{Limit, Plan};

pub use super::reset_log::{ResetNews, ResetRead};

/// One limit of one entity in a sync call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncItem {
    /// The entity.
    pub entity: u128,
    /// Which limit of the entity's rule.
    pub limit: u8,
    /// What to do with its counters.
    pub op: SyncOp,
}

/// What a sync does to one limit's counters in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOp {
    /// A window: keep the larger of this replica's part of the counters of `epochs`
    /// (current, previous) and `parts`, hits and refunds apart, new refunds applied only as
    /// far as the count holds (`Held::state`), and return both totals, each at least its
    /// floor less the refunds the counter applied.
    Window {
        /// The current and previous epoch.
        epochs: [u64; 2],
        /// This replica's part of each: every hit and refund it counted there so far.
        parts: [Part; 2],
        /// The totals this replica last read (`SyncPlan::floors`): a store that lost the
        /// counters answers them, less its applied refunds, until the replicas restated their
        /// parts.
        floors: [u64; 2],
        /// Expiry of a counter the call creates: two windows.
        ttl_ms: u64,
    },
    /// A token bucket (`core/bucket/`): in place of `delta`, what `stated` holds that the
    /// store has not applied for this replica yet (`memory::fresh`); spend `spend` tokens
    /// (corrected by as much) from `since_us` —
    /// `tat = max(tat, since) + spend × interval`, at most `max_ahead` past now (a refund,
    /// negative, never takes it below now) — add `delta` to the running count of tokens
    /// spent, and return `[tat (Unix µs), spent]`. A bucket the store does not hold starts
    /// at `tat = floor_us` (0: full), so a Redis that restarted empty gets back what this
    /// replica last read.
    Bucket {
        /// Tokens to add to the running count (negative: given back).
        delta: i64,
        /// Tokens to spend from `since_us` (negative: give back): the last `delta`'s run,
        /// spent since the replica last saw the bucket full (`BucketPlan::spend`).
        spend: i64,
        /// Now, on the fleet's clock (Unix µs).
        now_us: u64,
        /// When the first of the tokens was spent (Unix µs; at most now).
        since_us: u64,
        /// Time to refill one token (ns).
        interval_ns: u64,
        /// How far past now the bucket's `tat` may go (ns).
        max_ahead_ns: u64,
        /// The `tat` a lost bucket is restored to (Unix µs; 0: full).
        floor_us: u64,
        /// The bucket is kept this long after it is full again (ms).
        ttl_ms: u64,
        /// Tokens this replica spent and gave back so far, each modulo 2^32
        /// (`BucketPlan::stated`): the store applies what it has not applied yet.
        stated: [u32; 2],
    },
}

impl SyncItem {
    /// The item of `limit` (index `index` of the entity's rule) for `plan`, begun at `now`.
    pub fn of(entity: u128, index: u8, limit: &Limit, plan: &Plan, now: UnixMillis) -> Self {
        let op = match plan {
            Plan::Window(p) => SyncOp::Window {
                epochs: p.epochs,
                parts: p.parts,
                floors: p.floors,
                ttl_ms: 2 * limit.window_ms,
            },
            Plan::Bucket(p) => {
                let g = Geometry::of(limit);
                SyncOp::Bucket {
                    delta: p.delta,
                    spend: p.spend,
                    now_us: now.0.saturating_mul(1000),
                    since_us: p.since_ms.clamp(1, now.0).saturating_mul(1000),
                    interval_ns: g.interval_ns,
                    max_ahead_ns: g.max_ahead_ns,
                    floor_us: p.floor_us,
                    // Its running count of spends outlives a full bucket by a minute, so
                    // rates measured across a quiet spell stay whole.
                    ttl_ms: 60_000,
                    stated: p.stated,
                }
            }
        };
        SyncItem {
            entity,
            limit: index,
            op,
        }
    }
}

/// A replica announcing itself: one member per replica in the shard's set of live replicas,
/// scored by when it was last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// The replica's random id.
    pub replica: u64,
    /// Now, on the fleet's (offset-corrected) clock, Unix ms.
    pub now_ms: u64,
    /// A replica not seen for this long is no longer live.
    pub ttl_ms: u64,
    /// The replica is stopping: remove it rather than refresh it.
    pub leaving: bool,
    /// The store's generation if it holds none: a fresh random number per heartbeat
    /// ([`new_generation`]), so a store that lost its keys twice never gets an old one back.
    pub new_generation: u64,
    /// What to read of the shard's reset log (`reset_log.rs`).
    pub resets: ResetRead,
}

/// What a heartbeat answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// How many replicas are live, this one included.
    pub live: u32,
    /// The store's generation (written by this heartbeat when the store held none); `None`
    /// when the store keeps none (a fake) or could not read it.
    pub generation: Option<u64>,
    /// The reset log's entries [`Heartbeat::resets`] asked for; `None` when it asked for
    /// none, or the store keeps no log (a fake) or could not read it.
    pub resets: Option<ResetNews>,
}

/// One counter's RLQS streams on this replica, as published each tick
/// (`global/presence.rs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Presence {
    /// The counter: the entity the sync uses.
    pub entity: u128,
    /// Envoy streams of this replica subscribed to it (0: this replica leaves it).
    pub streams: u32,
    /// Their demand, requests/s (finite, >= 0; anything else is read as 0, and more than
    /// [`MAX_DEMAND`] as that).
    pub demand: f64,
}

/// What the other live replicas published for one counter.
#[derive(Default, Clone, Copy, PartialEq, Debug)]
pub struct Others {
    /// Their streams on it, summed.
    pub streams: u64,
    /// Their demand, requests/s, summed (to the milli-request/s, as the store keeps it).
    pub demand: f64,
}

/// The most demand a replica publishes for one counter, requests/s: the store keeps demand in
/// integer milli-requests/s (Redis turns a Lua number into an integer), and sums of up to a
/// million replicas' stay below 2^53, where a Lua number is still exact.
pub const MAX_DEMAND: f64 = 1e9;

impl Presence {
    /// The demand as the store keeps it: milli-requests/s, rounded, within
    /// 0..=[`MAX_DEMAND`]·1000 (NaN and negatives: 0).
    pub fn demand_milli(&self) -> u64 {
        if self.demand.is_nan() || self.demand <= 0.0 {
            return 0;
        }
        (self.demand.min(MAX_DEMAND) * 1000.0).round() as u64
    }
}

impl Others {
    /// The others' sums as the store returns them: streams, and demand in milli-requests/s.
    pub fn from_milli(streams: u64, demand_milli: u64) -> Self {
        Others {
            streams,
            demand: demand_milli as f64 / 1000.0,
        }
    }
}

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within the command timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The store answered with an error or the connection failed.
    #[error("{message}")]
    Backend {
        /// What kind of failure, as the store's client classified it.
        kind: StoreErrorKind,
        /// The client's message.
        message: String,
    },
}

/// What kind of failure a store call met: Redis's `ErrorKind` classified
/// (`global/redis/error.rs`), so the callers can tell a failure that passes from one that
/// stays (Limitador's storage errors do the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The connection failed, was refused or dropped, or no node served the key.
    Connection,
    /// The store is loading, busy, failing over or moving slots (`LOADING`, `BUSY`,
    /// `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `MOVED`, `ASK`).
    Unavailable,
    /// The store refused the credentials or the command's permission.
    Auth,
    /// The store answered an error to the command, or a reply the call cannot read.
    Reply,
    /// The client's settings are wrong, or the store cannot do what was asked.
    Other,
}

impl StoreError {
    /// A failure of `kind` with the client's `message`.
    pub fn backend(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError::Backend {
            kind,
            message: message.into(),
        }
    }

    /// A failed or refused connection.
    pub fn connection(message: impl Into<String>) -> Self {
        Self::backend(StoreErrorKind::Connection, message)
    }

    /// A reply the call cannot read.
    pub fn reply(message: impl Into<String>) -> Self {
        Self::backend(StoreErrorKind::Reply, message)
    }

    /// What the store cannot do.
    pub fn other(message: impl Into<String>) -> Self {
        Self::backend(StoreErrorKind::Other, message)
    }

    /// The kind of failure (a timeout is [`StoreErrorKind::Connection`]'s: no answer).
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Timeout(_) => StoreErrorKind::Connection,
            StoreError::Backend { kind, .. } => *kind,
        }
    }

    /// Whether the same call may succeed later without anyone changing anything: a timeout,
    /// a connection lost or refused, a store loading or failing over. Not: refused
    /// credentials, an error to the command, a reply the call cannot read, wrong settings.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind(),
            StoreErrorKind::Connection | StoreErrorKind::Unavailable
        )
    }
}

/// What one round trip to a shard carries: this replica's parts of the counters of `items`
/// (totals returned in order), its heartbeat, and its RLQS streams ([`Publish`]), each
/// optional. The sync's ticks carry the items and the heartbeat; the presence loop carries
/// the streams alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trip<'a> {
    /// Keep in the part of the replica the larger of what it holds and what each item
    /// states, and answer each item's totals.
    pub items: &'a [SyncItem],
    /// Refresh (or, when leaving, remove) the beat's replica, drop those not seen within the
    /// TTL, and answer how many are live and the store's generation (writing
    /// `new_generation` when it holds none). With items, a failed heartbeat only leaves
    /// [`Answer::beat`] empty (the parts were stated all the same); alone, it fails the trip.
    pub beat: Option<&'a Heartbeat>,
    /// Publish the replica's RLQS streams and read the others'.
    pub publish: Option<Publish<'a>>,
}

/// The RLQS part of a [`Trip`]: publish the replica's streams on each counter of `items`
/// until `now_ms + ttl_ms` (a 0 removes them), forget what other replicas published that
/// expired by `now_ms`, and answer, per item in order, what the other replicas still publish.
#[derive(Debug, Clone, Copy)]
pub struct Publish<'a> {
    /// This replica's streams per counter.
    pub items: &'a [Presence],
    /// Now, on the fleet's clock (Unix ms).
    pub now_ms: u64,
    /// How long the published streams last.
    pub ttl_ms: u64,
}

/// What a [`Trip`] answers, part by part.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    /// Each item's totals, in order (empty without items).
    pub totals: Vec<[u64; 2]>,
    /// The heartbeat's answer (`None`: no heartbeat, or it failed beside items).
    pub beat: Option<Beat>,
    /// What the others publish per [`Publish`] item, in order (empty without it).
    pub others: Vec<Others>,
}

/// A [`Trip`] as separate calls, for a store that cannot make it one (the in-memory store,
/// the simulator's, the tests' fakes): the streams, the items, then the heartbeat.
pub async fn in_steps<'a, S, B, P>(
    trip: Trip<'a>,
    sync: impl FnOnce(&'a [SyncItem]) -> S,
    beat: impl FnOnce(&'a Heartbeat) -> B,
    publish: impl FnOnce(Publish<'a>) -> P,
) -> Result<Answer, StoreError>
where
    S: Future<Output = Result<Vec<[u64; 2]>, StoreError>>,
    B: Future<Output = Result<Beat, StoreError>>,
    P: Future<Output = Result<Vec<Others>, StoreError>>,
{
    let mut answer = Answer::default();
    if let Some(p) = trip.publish {
        answer.others = publish(p).await?;
    }
    if !trip.items.is_empty() {
        answer.totals = sync(trip.items).await?;
    }
    if let Some(b) = trip.beat {
        let replied = beat(b).await;
        answer.beat = if trip.items.is_empty() {
            Some(replied?)
        } else {
            replied.ok()
        };
    }
    Ok(answer)
}

/// A [`Trip`] for a store that sends the sync and the heartbeat in one call (Redis, the
/// simulator's): the streams, then the items with the heartbeat, or the items alone.
pub async fn beat_in_one<'a, S, SB, P>(
    trip: Trip<'a>,
    sync: impl FnOnce(&'a [SyncItem]) -> S,
    sync_and_beat: impl FnOnce(&'a [SyncItem], &'a Heartbeat) -> SB,
    publish: impl FnOnce(Publish<'a>) -> P,
) -> Result<Answer, StoreError>
where
    S: Future<Output = Result<Vec<[u64; 2]>, StoreError>>,
    SB: Future<Output = Result<(Vec<[u64; 2]>, Option<Beat>), StoreError>>,
    P: Future<Output = Result<Vec<Others>, StoreError>>,
{
    let mut answer = Answer::default();
    if let Some(p) = trip.publish {
        answer.others = publish(p).await?;
    }
    match trip.beat {
        Some(beat) => (answer.totals, answer.beat) = sync_and_beat(trip.items, beat).await?,
        None if !trip.items.is_empty() => answer.totals = sync(trip.items).await?,
        None => {}
    }
    Ok(answer)
}

/// A shard of the shared store.
pub trait ShardStore: Send + Sync + 'static {
    /// A name for logs and readiness (no secrets).
    fn name(&self) -> &str;
    /// One round trip to the shard: whatever `trip` carries ([`Trip`]), in one call where the
    /// store can (Redis pipelines the sync and the heartbeat), and what each part answers.
    fn round_trip(
        &self,
        replica: u64,
        trip: Trip<'_>,
    ) -> impl Future<Output = Result<Answer, StoreError>> + Send;
    /// The members of this shard's set of replicas, each with the time its last heartbeat
    /// stated (Unix ms), expired ones included until a heartbeat drops them: a replica
    /// joining the fleet watches them for the others' next heartbeats (`global/join.rs`).
    /// This default lists none, so a join waits the whole heartbeat round; Redis and the
    /// in-memory store implement it.
    fn replicas(&self) -> impl Future<Output = Result<Vec<(u64, u64)>, StoreError>> + Send {
        async { Err(StoreError::other("this store does not list its replicas")) }
    }
    /// The store's clock (Unix ms), to correct this node's.
    fn time_ms(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// How many commands a call with `items` items sends.
    fn commands_for(&self, items: usize) -> usize {
        usize::from(items > 0)
    }
    /// How many commands a heartbeat sends.
    fn commands_for_beat(&self) -> usize {
        1
    }
}

/// A random id for this replica's part of every counter: drawn once per process start (by
/// `global::spawn`), so a restarted replica is a new replica. No two live replicas share one
/// but by a 2^-64 chance; if they did, their parts would merge, and only the rebuilding after
/// a Redis restart would lose precision (a shared part is raised to the larger of the two).
pub fn new_replica_id() -> u64 {
    random()
}

/// A random store generation for a heartbeat to write where there is none
/// ([`Heartbeat::new_generation`]): a new one each call.
pub fn new_generation() -> u64 {
    random()
}

fn random() -> u64 {
    use std::hash::BuildHasher;
    // std's hasher keys are random per process (and differ between calls): no RNG crate.
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}
