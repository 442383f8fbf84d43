//! An operator's reset (`global/exact/reset.rs`) as two replicas' sync tasks see it on the
//! in-memory store (the twin of `reset.lua`): the count goes to 0 for good, each replica's
//! next sync reads it, and neither a replica's statement of its part nor its floor (the
//! count it last read) brings the old count back. A replica with no request for the key
//! learns of the reset from the reset log its next tick reads (`reset_log.rs`), or, when the
//! log was trimmed past it, at its next sync of the key.

use std::sync::Arc;

use super::shard::tests::{limit, on, setup, T0};
use super::{Fleet, ShardRouter, ShardSync, SyncQueues};
use crate::core::clock::{Clock, ManualClock, UnixMillis};
use crate::core::table::{CacheSettings, EntityTable};
use crate::core::{LimitState, Verdict};
use crate::global::memory::MemoryStore as FakeStore;

const KEY: u128 = 7;
const EPOCHS: [u64; 2] = [T0 / 60_000, T0 / 60_000 - 1];

/// Replica B beside `a`: its own table, queues and id, on `a`'s store and clock.
fn replica_b(a: &ShardSync<FakeStore>) -> (EntityTable, ShardSync<FakeStore>) {
    let queues = Arc::new(SyncQueues::new(ShardRouter::new(&["a".into()]), 1, 1000));
    let table = EntityTable::new(CacheSettings::default());
    let b = ShardSync {
        queues,
        table: table.clone(),
        fleet: Arc::new(Fleet::new(2)),
        health: Arc::new(super::ShardHealth::new("fake".into())),
        ..a.clone()
    };
    (table, b)
}

/// `n` hits on the entity through `s`'s table; the last one's verdict.
fn hits(table: &EntityTable, s: &ShardSync<FakeStore>, clock: &ManualClock, n: u64) -> Verdict {
    on(table, KEY, clock.now(), |st| {
        let mut v = None;
        for _ in 0..n {
            v = Some(crate::core::fixtures::hit(
                &mut st.states[0],
                &limit(),
                clock.now(),
                1,
            ));
        }
        s.queues.mark_dirty(KEY, st, false);
        v.expect("at least one hit")
    })
}

/// Ticks of A then B, a second apart, until each has read the other's last statement
/// (every entity is due by then, whatever its tier).
async fn ticks(clock: &ManualClock, a: &ShardSync<FakeStore>, b: &ShardSync<FakeStore>) {
    for s in [a, b, a, b, a] {
        clock.advance_ms(1000);
        s.tick(false).await.unwrap();
    }
}

/// The count the replica sees now (own unsent hits included).
fn seen(table: &EntityTable, now: UnixMillis) -> u64 {
    on(table, KEY, now, |st| match &mut st.states[0] {
        LimitState::Window(w) => w.current_count(&limit(), now),
        LimitState::Bucket(_) => unreachable!("a window"),
    })
}

#[tokio::test]
async fn a_reset_reaches_both_replicas_at_their_next_sync_and_no_statement_undoes_it() {
    let (table_a, _, a, clock) = setup();
    let (table_b, b) = replica_b(&a);
    let store = a.store.clone();
    // Both heartbeats first: each knows the fleet is two before the entity is hit.
    for s in [&a, &b, &a] {
        s.tick(false).await.unwrap();
    }
    // 60 hits on each, synced both ways: the fleet is at 120 of 100, and both deny.
    hits(&table_a, &a, &clock, 60);
    hits(&table_b, &b, &clock, 60);
    ticks(&clock, &a, &b).await;
    assert_eq!(store.total(KEY, 0, EPOCHS[0]), 120);
    assert_eq!(
        (seen(&table_a, clock.now()), seen(&table_b, clock.now())),
        (120, 120)
    );
    // B counts 5 more it has not sent when the reset comes through A.
    assert!(hits(&table_b, &b, &clock, 5).over);
    assert_eq!(store.reset_window(KEY, 0, EPOCHS), [120, 0]);
    on(&table_a, KEY, clock.now(), |st| st.states[0].forget(true));
    assert_eq!(store.total(KEY, 0, EPOCHS[0]), 0);
    // A admits at once.
    assert!(!hits(&table_a, &a, &clock, 1).over);
    // Each replica's next sync states its whole part again (A 61, B 65) with its floor of
    // 120: the store keeps the reset, and both read what came after it.
    ticks(&clock, &a, &b).await;
    assert_eq!(store.total(KEY, 0, EPOCHS[0]), 6);
    // B read the 6 (A's 1 and its own 5); A, at 1 % of the limit, reads no more until its
    // count rises (the Idle tier), and sees its own 1, never the 120 again.
    assert_eq!(
        (seen(&table_a, clock.now()), seen(&table_b, clock.now())),
        (1, 6)
    );
    assert!(!hits(&table_b, &b, &clock, 1).over);
    // A statement resent later (a call that timed out and ran again) changes nothing.
    let stale = super::SyncItem {
        entity: KEY,
        limit: 0,
        op: super::SyncOp::Window {
            epochs: EPOCHS,
            parts: [
                crate::core::Part {
                    hits: 60,
                    refunds: 0,
                },
                Default::default(),
            ],
            floors: [120, 0],
            ttl_ms: 120_000,
        },
    };
    assert_eq!(store.sync(2, &[stale]).await.unwrap()[0][0], 6);
    // A refund of hits made before the reset frees nothing the count does not hold.
    let refund = super::SyncItem {
        op: match stale.op {
            super::SyncOp::Window {
                epochs,
                floors,
                ttl_ms,
                ..
            } => super::SyncOp::Window {
                epochs,
                parts: [
                    crate::core::Part {
                        hits: 61,
                        refunds: 50,
                    },
                    Default::default(),
                ],
                floors,
                ttl_ms,
            },
            op => op,
        },
        ..stale
    };
    assert_eq!(store.sync(1, &[refund]).await.unwrap()[0][0], 0);
}

/// Two replicas at 120 of 100 on one store, both having read it (and the reset log's head).
async fn both_at_the_limit() -> (
    EntityTable,
    EntityTable,
    ShardSync<FakeStore>,
    ShardSync<FakeStore>,
    ManualClock,
) {
    let (table_a, _, a, clock) = setup();
    let (table_b, b) = replica_b(&a);
    for s in [&a, &b, &a] {
        s.tick(false).await.unwrap();
    }
    hits(&table_a, &a, &clock, 60);
    hits(&table_b, &b, &clock, 60);
    ticks(&clock, &a, &b).await;
    assert_eq!(seen(&table_b, clock.now()), 120);
    (table_a, table_b, a, b, clock)
}

/// A reset of the key through the store, as `ExactClient::reset` makes it: the counters,
/// then the reset log (`entities` logged, kept to `max_len`).
async fn reset_through_the_store(store: &FakeStore, entities: &[u128], max_len: usize) {
    use crate::global::exact::ExactStore;
    store.reset_window(KEY, 0, EPOCHS);
    store.log_resets(entities, max_len).await.unwrap();
}

#[tokio::test]
async fn an_idle_replica_clears_its_view_at_its_next_tick_from_the_reset_log() {
    let (_table_a, table_b, a, b, clock) = both_at_the_limit().await;
    reset_through_the_store(&a.store, &[KEY], 100).await;
    // No hit on B: its next tick's heartbeat reads the log and clears its view.
    clock.advance_ms(1000);
    b.tick(false).await.unwrap();
    assert_eq!(seen(&table_b, clock.now()), 0);
    assert_eq!(
        (b.health.reset_log.applied(), b.health.reset_log.missed()),
        (1, 0)
    );
    // It queued the key: the tick after reads the store's count, still 0.
    clock.advance_ms(1000);
    b.tick(false).await.unwrap();
    assert_eq!(seen(&table_b, clock.now()), 0);
    assert!(!hits(&table_b, &b, &clock, 1).over);
    // An entry read once is not read again.
    clock.advance_ms(1000);
    b.tick(false).await.unwrap();
    assert_eq!(b.health.reset_log.applied(), 1);
}

#[tokio::test]
async fn a_replica_that_missed_trimmed_entries_counts_them_and_clears_the_key_at_its_next_sync() {
    let (_table_a, table_b, a, b, clock) = both_at_the_limit().await;
    // Between two reads of B, the key's reset and 9 others go through a log kept to 5.
    let mut entities = vec![KEY];
    entities.extend(100..109);
    reset_through_the_store(&a.store, &entities, 5).await;
    clock.advance_ms(1000);
    b.tick(false).await.unwrap();
    // The key's entry was trimmed: B cannot clear it from the log, and counts the miss.
    assert_eq!(
        (b.health.reset_log.applied(), b.health.reset_log.missed()),
        (5, 5)
    );
    assert_eq!(seen(&table_b, clock.now()), 120);
    // Its next request is decided from that view (denied) and queues the key; the next
    // tick reads the store's count, and the key is admitted again.
    assert!(hits(&table_b, &b, &clock, 1).over);
    clock.advance_ms(1000);
    b.tick(false).await.unwrap();
    assert!(seen(&table_b, clock.now()) <= 1);
    assert!(!hits(&table_b, &b, &clock, 1).over);
}

#[tokio::test]
async fn a_reset_of_a_counter_at_zero_or_absent_writes_nothing() {
    let store = FakeStore::default();
    assert_eq!(store.reset_window(KEY, 0, EPOCHS), [0, 0]);
    assert!(store.counters.lock().is_empty());
    let _ = T0;
}
