//! An operator's reset on a real redis-server against the in-memory twin (`reset.lua` and
//! `MemoryStore`): the counts before come back alike; the sync's counter is 0 afterwards and
//! stays so against the replicas' statements of their old parts and their floors, counting
//! only what came after; a refund of hits made before it frees nothing the count does not
//! hold; an exact rule's keys are deleted.

use crate::common::redis::RedisServer;
use sluice::core::window::Prev;
use sluice::core::Part;
use sluice::global::memory::MemoryStore;
use sluice::global::redis::exact::RedisExact;
use sluice::global::redis::{RedisOptions, RedisStore};
use sluice::global::{ExactItem, ExactStore, ResetItem, ResetKind, SyncItem, SyncOp};

const NOW_MS: u64 = 1_700_000_040_000;
const EPOCH: u64 = NOW_MS / 60_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A replica's statement of entity 7's counter: `hits` and `refunds` so far, having last
/// read `floor`.
fn state(hits: u64, refunds: u64, floor: u64) -> SyncItem {
    SyncItem {
        entity: 7,
        limit: 0,
        op: SyncOp::Window {
            epochs: [EPOCH, EPOCH - 1],
            parts: [Part { hits, refunds }, Part::default()],
            floors: [floor, 0],
            ttl_ms: 120_000,
        },
    }
}

fn reset_item(kind: ResetKind) -> ResetItem {
    ResetItem {
        entity: 7,
        limit: 0,
        kind,
        per_second: false,
    }
}

#[test]
fn a_reset_clears_the_count_for_good_on_redis_as_in_memory() {
    let redis = RedisServer::start();
    let rt = runtime();
    let opts = RedisOptions::default();
    let shard = RedisStore::new(&redis.url(), &opts).unwrap();
    let (_, exact) = RedisExact::all(&[redis.url()], false, None, &opts)
        .unwrap()
        .pop()
        .unwrap();
    let memory = MemoryStore::default();
    let both = |replica, it: SyncItem| {
        let want = rt.block_on(memory.sync(replica, &[it])).unwrap()[0][0];
        let got = rt.block_on(shard.sync(replica, &[it])).unwrap()[0][0];
        assert_eq!(got, want, "redis and memory, {replica}: {it:?}");
        got
    };
    let reset = |items: &[ResetItem]| {
        let want = rt.block_on(memory.reset(items)).unwrap();
        let got = rt.block_on(exact.reset(items)).unwrap();
        assert_eq!(got, want, "redis and memory: {items:?}");
        got
    };
    let window = reset_item(ResetKind::Window {
        epochs: [EPOCH, EPOCH - 1],
    });
    assert_eq!(both(1, state(30, 0, 0)), 30);
    assert_eq!(both(2, state(40, 0, 30)), 70);
    assert_eq!(reset(&[window]), vec![[70, 0]]);
    // Their old parts stated again, with floors of 70: 0. Replica 2's 5 new hits count.
    assert_eq!(both(1, state(30, 0, 70)), 0);
    assert_eq!(both(2, state(45, 0, 70)), 5);
    // Replica 1 gives back 20 of its hits from before the reset: 5 apply, not 20.
    assert_eq!(both(1, state(30, 20, 5)), 0);
    assert_eq!(both(2, state(46, 0, 0)), 1);
    // A second reset takes the 1; one of a counter at 0 (the previous epoch) writes nothing.
    assert_eq!(reset(&[window]), vec![[1, 0]]);
    assert_eq!(both(3, state(0, 0, 1)), 0);
    let prev = format!("sluice:v2:{{{:032x}}}:0:{}", 7, EPOCH - 1);
    assert_eq!(redis.cli(&["EXISTS", &prev]).trim(), "0");
    // An exact rule's counter: 3 counted, then deleted.
    let it = ExactItem {
        entity: 7,
        limit: 0,
        epoch: EPOCH,
        window_ms: 60_000,
        left_ms: 60_000 - NOW_MS % 60_000,
        prev: Prev::Out,
        requests_per_unit: 10,
        hits: 3,
        ttl_ms: 120_000,
        refund: false,
        bucket: None,
        per_second: false,
    };
    rt.block_on(memory.exact(&[it], true)).unwrap();
    rt.block_on(exact.exact(&[it], true)).unwrap();
    let exact_window = reset_item(ResetKind::ExactWindow {
        epochs: [EPOCH, EPOCH - 1],
    });
    assert_eq!(reset(&[exact_window]), vec![[3, 0]]);
    assert_eq!(redis.cli(&["KEYS", "*sluice:x:*"]).trim(), "");
    assert!(memory.exact.lock().is_empty());
}
