//! Joining the fleet at start: a replica registers its heartbeat and reads the live count
//! before it reports ready, and waits until the running replicas have counted it.
//!
//! Why: a young entity keeps to its prior, `1.05 × limit / live replicas`
//! (`core/window/prior.rs`), and a replica learns the live count from its own heartbeat
//! replies, one a sync tick. A replica that served before its first reply, or a running one
//! whose last reply predates a newcomer, decides on a live count one too low: two replicas
//! started within a second of each other, then hit by a surge on a new value, admitted up
//! to 1.27× the limit, one of them deciding as if alone for up to a tick.
//!
//! So [`JoinTask`] (started by `global::spawn`, readiness waiting on [`Joining::done`]):
//! 1. registers: a heartbeat on every shard, retried until one answers or
//!    `SYNC_JOIN_TIMEOUT` (counted from the start of global mode, and bounding the whole
//!    join) passes; the reply is the live count, this replica included. Then it reads the shard's set of replicas
//!    (`ShardStore::replicas`): each other member and the time its last heartbeat stated.
//!    If no shard answers, it says so (a warning, and `/readyz`) and the replica starts
//!    anyway, deciding locally as when Redis fails later;
//! 2. waits until every other member read there has sent a heartbeat since (its time in the
//!    set changed) or left: Redis runs one script at a time, so that heartbeat ran after the
//!    registration, and its reply, the live count that replica decides on, counted this one.
//!    No clocks are compared. At most a sync tick plus the call timeout: by then each
//!    running replica's tick heartbeat has landed and been answered, or that replica is
//!    degraded and decides locally anyway. A replica alone at registration waits a tick, to
//!    meet replicas started at about the same moment. Either wait ends at the timeout too
//!    (a warning when the running replicas had not all counted it: the tick is longer than
//!    the timeout allows for);
//! 3. reads the live count again (another heartbeat, which is also this replica's next
//!    heartbeat for the replicas that registered meanwhile and wait on it) and reports
//!    joined.
//!
//! Replicas started within a tick of each other therefore both count two before either
//! serves: the later one's registration counts the earlier, and waits for the earlier's next
//! heartbeat (its tick, or its step 3), which counts the later; and they turn ready within
//! about the call timeout of each other, so neither serves long on a count that includes one
//! not serving yet (a young entity's prior would then deny hits the exact limiter admits).
//! A replica joining a running fleet is ready once each running replica's next tick counted
//! it: half a tick on average, a tick at most. Meanwhile a running replica that counts it
//! keeps an entity young since before to the prior of the count before
//! (`core/window/prior.rs`), so that it does not deny hits for a replica not serving yet. The
//! price is that, and a tick for the first replica of a fleet, once per start.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::sync::SyncSettings;
use crate::global::sync::{
    new_generation, Fleet, Heartbeat, ResetRead, ShardStore, StoreError, Trip,
};

/// Where a replica is in joining the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinStatus {
    /// Registering its heartbeat with the stores.
    Registering,
    /// Registered: waiting for the running replicas' heartbeats to count it.
    Counting,
    /// The running replicas counted it.
    Joined,
    /// No store answered within the join timeout: it serves without knowing the fleet,
    /// deciding locally until Redis answers.
    Unanswered {
        /// The join timeout.
        timeout: Duration,
        /// The last store error.
        error: String,
    },
    /// The join is off (`SYNC_JOIN_TIMEOUT=0`): ready at once.
    Off,
}

impl JoinStatus {
    /// Whether the join is over: readiness no longer waits on it.
    pub fn is_done(&self) -> bool {
        !matches!(self, JoinStatus::Registering | JoinStatus::Counting)
    }
}

/// A replica's join, as readiness and `/readyz` see it.
#[derive(Debug, Clone)]
pub struct Joining {
    status: watch::Receiver<JoinStatus>,
    fleet: Arc<Fleet>,
}

impl Joining {
    /// Where the join is.
    pub fn status(&self) -> JoinStatus {
        self.status.borrow().clone()
    }

    /// The live replicas as the heartbeats last counted them (this one included).
    pub fn live_replicas(&self) -> u32 {
        self.fleet.live_replicas()
    }

    /// This replica's id in the fleet's heartbeats.
    pub fn replica_id(&self) -> u64 {
        self.fleet.replica_id()
    }

    /// Waits until the join is over (joined, unanswered or off; or global mode stopped
    /// before it was) and returns how it ended.
    pub async fn done(&self) -> JoinStatus {
        let mut rx = self.status.clone();
        let done = rx.wait_for(JoinStatus::is_done).await.map(|s| s.clone());
        // An error: the task ended first (shutdown during the join), nothing to wait for.
        done.unwrap_or_else(|_| self.status())
    }
}

impl fmt::Display for Joining {
    /// The `/readyz` line: where the join is, with the live count as the heartbeats last
    /// counted it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.fleet.live_replicas();
        match self.status() {
            JoinStatus::Registering => f.write_str("fleet: joining (registering with Redis)"),
            JoinStatus::Counting => write!(
                f,
                "fleet: joining (live replicas: {live}; waiting for the running ones to count this one)"
            ),
            JoinStatus::Joined | JoinStatus::Off => write!(f, "fleet: live replicas: {live}"),
            JoinStatus::Unanswered { timeout, error } => write!(
                f,
                "fleet: live replicas: {live} (started before Redis answered: nothing within {}, \
                 {error}; decided locally until it did)",
                humantime::format_duration(timeout)
            ),
        }
    }
}

/// How often a joining replica reads the sets of replicas, watching for the others' next
/// heartbeats: a read of one small key per shard, some fifty per start on average (a tick
/// plus the call timeout's worth at most), and the newcomer turns ready within this of the
/// last heartbeat it waits for.
const POLL: Duration = Duration::from_millis(10);

/// The join of one replica: its heartbeat on every store, then a heartbeat of each of the
/// others (see the module docs).
pub(crate) struct JoinTask<S> {
    /// Every shard, the per-second ones included: each keeps its own set of replicas.
    pub stores: Vec<Arc<S>>,
    pub fleet: Arc<Fleet>,
    pub clock: Arc<dyn Clock>,
    /// The main shards' settings: the tick, the heartbeat's TTL, the retry delay.
    pub settings: SyncSettings,
    /// The longest call timeout of any shard: how long a running replica's heartbeat reply
    /// may take.
    pub call_timeout: Duration,
    /// `SYNC_JOIN_TIMEOUT`.
    pub timeout: Duration,
    /// When the join gives up, registered or not: the timeout after global mode started.
    pub deadline: Instant,
    pub status: watch::Sender<JoinStatus>,
}

/// A join's status channel: the task's sender and what readiness reads. `off`: the join is
/// off, and over already.
pub(crate) fn channel(fleet: Arc<Fleet>, off: bool) -> (watch::Sender<JoinStatus>, Joining) {
    let first = if off {
        JoinStatus::Off
    } else {
        JoinStatus::Registering
    };
    let (tx, rx) = watch::channel(first);
    (tx, Joining { status: rx, fleet })
}

/// The other replicas of one shard's set, as read after the registration: id and the time
/// their last heartbeat stated. `None`: the shard did not answer.
type Others = Option<Vec<(u64, u64)>>;

impl<S: ShardStore> JoinTask<S> {
    /// Joins, unless `stop` comes first. Never panics on a store error: an unanswered join
    /// is reported and the replica starts anyway.
    pub async fn run(self, stop: CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.join() => {}
        }
    }

    async fn join(&self) {
        // The first try gets a call's time at least, however long the start took so far.
        let first = self.deadline.max(Instant::now() + self.call_timeout);
        let (live, others) = match self.register(first).await {
            Ok(registered) => registered,
            Err(e) => {
                tracing::warn!(
                    timeout = %humantime::format_duration(self.timeout),
                    error = %e,
                    "Redis did not answer at start: serving without knowing the fleet, deciding locally until it answers"
                );
                let _ = self.status.send(JoinStatus::Unanswered {
                    timeout: self.timeout,
                    error: e.to_string(),
                });
                return;
            }
        };
        self.fleet.observe_live(live, self.clock.now());
        let _ = self.status.send(JoinStatus::Counting);
        // Step 2 (module docs), bounded by a heartbeat round of the running replicas; alone,
        // a tick, so that its end falls with this replica's own tick heartbeat, which the
        // replicas that registered meanwhile wait on. Either within the join's timeout.
        let tick = Duration::from_millis(self.settings.policy.tick_ms);
        let waits = others.iter().flatten().any(|o| !o.is_empty());
        let round = Instant::now()
            + if waits {
                tick + self.call_timeout
            } else {
                tick
            };
        let until = round.min(self.deadline);
        let mut counted = !waits;
        while Instant::now() < until {
            tokio::time::sleep(POLL.min(until - Instant::now())).await;
            if waits && self.counted(&others).await {
                counted = true;
                break;
            }
        }
        if !counted && until < round {
            tracing::warn!(
                timeout = %humantime::format_duration(self.timeout),
                "ready before every running replica counted this one: SYNC_JOIN_TIMEOUT is shorter than SYNC_TICK plus REDIS_TIMEOUT"
            );
        }
        // Step 3. Its failure leaves the count of the registration and of the ticks.
        let beat = self.heartbeat_all(Instant::now() + self.call_timeout).await;
        if let Some(live) = beat.iter().flatten().copied().max() {
            self.fleet.observe_live(live, self.clock.now());
        }
        tracing::info!(
            live = self.fleet.live_replicas(),
            "joined the fleet: the running replicas count this one"
        );
        let _ = self.status.send(JoinStatus::Joined);
    }

    /// Registers on every store (see [`Self::heartbeat_all`]), tried again after the
    /// shortest backoff until one answers or `deadline` passes; then reads the other
    /// replicas of each store that answered. The live count is the largest any store
    /// answered.
    async fn register(&self, deadline: Instant) -> Result<(u32, Vec<Others>), StoreError> {
        loop {
            let beats = self.heartbeat_all(deadline).await;
            let live = beats.iter().filter_map(|b| b.as_ref().ok()).copied().max();
            if let Some(live) = live {
                let reads = self.stores.iter().zip(&beats).map(|(s, b)| async move {
                    match b {
                        Ok(_) => self.others(s, deadline).await,
                        Err(_) => None,
                    }
                });
                return Ok((live, join_all(reads).await));
            }
            let last = beats.into_iter().filter_map(Result::err).next_back();
            let retry = Instant::now() + self.settings.backoff_min;
            if retry >= deadline {
                return Err(last.unwrap_or(StoreError::other("no store")));
            }
            tokio::time::sleep_until(retry).await;
        }
    }

    /// This replica's heartbeat on every store at once, each bounded by `deadline`: the live
    /// count of each, or its error.
    async fn heartbeat_all(&self, deadline: Instant) -> Vec<Result<u32, StoreError>> {
        let beat = Heartbeat {
            replica: self.fleet.replica_id(),
            now_ms: self.clock.now().0,
            ttl_ms: self.settings.heartbeat_ttl_ms(),
            leaving: false,
            new_generation: new_generation(),
            resets: ResetRead::Skip,
        };
        // The generation and the reset log are left to the sync task's heartbeats, which
        // watch the one for a loss and read the other from where it is.
        let calls = self.stores.iter().map(|s| async move {
            let trip = Trip {
                beat: Some(&beat),
                ..Trip::default()
            };
            match tokio::time::timeout_at(deadline, s.round_trip(beat.replica, trip)).await {
                // A trip of a heartbeat alone answers one, or fails.
                Ok(r) => r
                    .and_then(|a| a.beat.ok_or_else(|| StoreError::reply("heartbeat failed")))
                    .map(|b| b.live),
                Err(_) => Err(StoreError::Timeout(self.timeout)),
            }
        });
        join_all(calls).await
    }

    /// The other live replicas of `store`'s set and the times of their last heartbeats;
    /// `None` when it does not answer by `deadline`.
    async fn others(&self, store: &S, deadline: Instant) -> Others {
        let read = tokio::time::timeout_at(deadline, store.replicas()).await;
        let me = self.fleet.replica_id();
        // A member past its TTL is gone for the next heartbeat of anyone.
        let oldest = self
            .clock
            .now()
            .0
            .saturating_sub(self.settings.heartbeat_ttl_ms());
        let all = read.ok()?.ok()?;
        Some(
            all.into_iter()
                .filter(|&(id, seen)| id != me && seen >= oldest)
                .collect(),
        )
    }

    /// Whether every replica of `registered` (each store's others at registration) has sent a
    /// heartbeat since, or left. A store that does not answer now is not counted yet.
    async fn counted(&self, registered: &[Others]) -> bool {
        let reads = self
            .stores
            .iter()
            .zip(registered)
            .map(|(store, then)| async move {
                let Some(then) = then else { return true };
                if then.is_empty() {
                    return true;
                }
                let deadline = Instant::now() + self.call_timeout;
                let Some(now) = self.others(store, deadline).await else {
                    return false;
                };
                then.iter().all(|(id, seen)| {
                    now.iter()
                        .find(|(other, _)| other == id)
                        .is_none_or(|(_, latest)| latest != seen)
                })
            });
        join_all(reads).await.into_iter().all(|ok| ok)
    }
}

#[cfg(test)]
#[path = "join_tests.rs"]
mod tests;
