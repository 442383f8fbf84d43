//! The join on the in-memory store, on tokio's paused clock: replicas started together,
//! a newcomer to a running fleet, a member that never beats again, a store that does not
//! answer.

use std::sync::atomic::Ordering;

use super::*;
use crate::core::clock::UnixMillis;
use crate::core::table::{CacheSettings, EntityTable};
use crate::global::memory::MemoryStore;
use crate::global::{spawn, Global, Parts, Stores, SyncConfig};
use crate::telemetry::Telemetry;

const T0: u64 = 1_700_000_040_000;
const TICK: Duration = Duration::from_millis(1_000);
/// `SyncSettings::default()`'s call timeout.
const TIMEOUT: Duration = Duration::from_millis(100);

/// Unix time `T0` at `zero`, moving with tokio's (paused) clock: heartbeats state the time.
struct TokioClock {
    zero: Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> UnixMillis {
        UnixMillis(T0 + Instant::now().duration_since(self.zero).as_millis() as u64)
    }
}

/// A replica on `store`, numbered `id`, joining within `join_timeout` (zero: no join).
async fn replica(
    store: &Arc<MemoryStore>,
    id: u64,
    join_timeout: Duration,
    zero: Instant,
) -> Global {
    let config = SyncConfig {
        join_timeout,
        ..SyncConfig::new(SyncSettings::default(), 1_000)
    };
    let telemetry = Telemetry::new().expect("a metrics pipeline");
    let clock: Arc<dyn Clock> = Arc::new(TokioClock { zero });
    let stores = Stores::one(store.clone());
    let parts = Parts {
        table: EntityTable::new(CacheSettings::default()),
        fleet: Arc::new(Fleet::new(id)),
        queues: stores.queues(&config),
        presence: None,
    };
    spawn(
        config,
        stores,
        parts,
        clock,
        &telemetry,
        CancellationToken::new(),
    )
    .await
}

/// Waits for `g`'s join and says when it ended and what each replica then counted.
async fn joined(g: &Global, fleet: &[&Global]) -> (Instant, JoinStatus, Vec<u32>) {
    let status = g.joining.done().await;
    let live = fleet.iter().map(|r| r.joining.live_replicas()).collect();
    (Instant::now(), status, live)
}

#[tokio::test(start_paused = true)]
async fn replicas_started_together_both_count_two_before_either_is_ready() {
    let zero = Instant::now();
    let store = Arc::new(MemoryStore::default());
    let a = replica(&store, 1, Duration::from_secs(2), zero).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = replica(&store, 2, Duration::from_secs(2), zero).await;
    let fleet = [&a, &b];
    let (at_a, at_b) = tokio::join!(joined(&a, &fleet), joined(&b, &fleet));
    assert_eq!(at_a.1, JoinStatus::Joined);
    assert_eq!(at_b.1, JoinStatus::Joined);
    // Each ready with both counting two.
    assert_eq!(at_a.2, vec![2, 2], "when a turned ready");
    assert_eq!(at_b.2, vec![2, 2], "when b turned ready");
    // a, alone at registration, waits a tick for company; b, whose registration counted a,
    // is ready at a's next heartbeat: within a few polls of a.
    assert!(
        at_a.0 >= zero + TICK,
        "a ready {:?} after start",
        at_a.0 - zero
    );
    let apart = at_a.0.max(at_b.0) - at_a.0.min(at_b.0);
    assert!(apart <= 3 * POLL, "ready {apart:?} apart");
    assert_eq!(format!("{}", b.joining), "fleet: live replicas: 2");
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_is_ready_once_the_running_replica_counted_it() {
    let zero = Instant::now();
    let store = Arc::new(MemoryStore::default());
    let running = replica(&store, 1, Duration::ZERO, zero).await;
    assert_eq!(running.joining.status(), JoinStatus::Off);
    // Its tick heartbeats at 0, 1 s, 2 s...: the newcomer registers 1.3 s in.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(running.joining.live_replicas(), 1);
    let started = Instant::now();
    let newcomer = replica(&store, 2, Duration::from_secs(2), zero).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(newcomer.joining.status(), JoinStatus::Counting);
    assert_eq!(
        format!("{}", newcomer.joining),
        "fleet: joining (live replicas: 2; waiting for the running ones to count this one)"
    );
    let at = joined(&newcomer, &[&running, &newcomer]).await;
    assert_eq!(at.1, JoinStatus::Joined);
    assert_eq!(
        at.2,
        vec![2, 2],
        "both count two when the newcomer turns ready"
    );
    // Not before the running replica's tick at 2 s, and soon after it (not a whole round).
    let waited = at.0 - started;
    assert!(
        waited >= Duration::from_millis(700) && waited <= Duration::from_millis(700) + 3 * POLL,
        "ready {waited:?} after its start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_that_never_beats_again_holds_a_join_one_round_at_most() {
    let zero = Instant::now();
    let store = Arc::new(MemoryStore::default());
    // A replica that died a moment ago: its heartbeat is live for a few seconds more.
    store.replicas.lock().insert(9, T0);
    let newcomer = replica(&store, 2, Duration::from_secs(2), zero).await;
    assert_eq!(newcomer.joining.live_replicas(), 1, "not registered yet");
    let at = joined(&newcomer, &[&newcomer]).await;
    assert_eq!(at.1, JoinStatus::Joined);
    assert_eq!(at.2, vec![2]);
    let waited = at.0 - zero;
    assert!(
        waited >= TICK + TIMEOUT && waited <= TICK + TIMEOUT + 3 * POLL,
        "ready {waited:?} after its start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_that_does_not_answer_leaves_the_replica_to_start_alone_after_the_timeout() {
    let zero = Instant::now();
    let store = Arc::new(MemoryStore::default());
    store.down.store(true, Ordering::Relaxed);
    let g = replica(&store, 1, Duration::from_millis(700), zero).await;
    assert_eq!(g.joining.status(), JoinStatus::Registering);
    assert_eq!(
        format!("{}", g.joining),
        "fleet: joining (registering with Redis)"
    );
    let at = joined(&g, &[&g]).await;
    assert_eq!(
        at.1,
        JoinStatus::Unanswered {
            timeout: Duration::from_millis(700),
            error: "connection refused".into()
        }
    );
    // Given up by the timeout, counted from the start of global mode (retried meanwhile).
    let waited = at.0 - zero;
    assert!(
        waited <= Duration::from_millis(700),
        "gave up after {waited:?}"
    );
    assert!(
        waited >= Duration::from_millis(500),
        "gave up after {waited:?}"
    );
    assert_eq!(
        format!("{}", g.joining),
        "fleet: live replicas: 1 (started before Redis answered: nothing within 700ms, \
         connection refused; decided locally until it did)"
    );
}

#[tokio::test(start_paused = true)]
async fn the_timeout_bounds_the_whole_join() {
    let zero = Instant::now();
    let store = Arc::new(MemoryStore::default());
    // A member that does not beat again within the round (gone, or on a longer tick), and
    // a newcomer whose timeout is shorter than the round: ready at its timeout all the same.
    store.replicas.lock().insert(9, T0);
    let newcomer = replica(&store, 2, Duration::from_millis(600), zero).await;
    let at = joined(&newcomer, &[&newcomer]).await;
    assert_eq!(at.1, JoinStatus::Joined);
    let waited = at.0 - zero;
    assert!(
        waited >= Duration::from_millis(600) && waited <= Duration::from_millis(600) + TIMEOUT,
        "ready {waited:?} after its start"
    );
}
