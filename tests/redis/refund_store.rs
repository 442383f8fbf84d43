//! More given back than was taken, on a real redis-server against the in-memory twin. A
//! window (`sync.lua` and `MemoryStore`, over `core::window::Held`): each replica's refunds
//! are applied once, when they first reach the store, and only as far as the count holds
//! hits; resent, late and reordered calls apply nothing. A token bucket (`bucket.lua`): a
//! give-back never fills it past full. And a rolling upgrade keeps one counter: the
//! previous `sync.lua` (`tests/data/previous/sync.lua`, verbatim as of commit 21e0198, with
//! no kept-out field) and this one read each other's counters.

use crate::common::redis::RedisServer;
use sluice::core::Part;
use sluice::global::memory::MemoryStore;
use sluice::global::redis::{RedisOptions, RedisStore};
use sluice::global::{SyncItem, SyncOp};

const NOW_MS: u64 = 1_700_000_040_000;
const EPOCH: u64 = NOW_MS / 60_000;

const PREVIOUS_SYNC: &str = include_str!("../data/previous/sync.lua");

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A replica's statement of entity 7's counter: `hits` and `refunds` so far in the current
/// epoch, `prev` in the previous one, having last read `floor` of the current one.
fn state(hits: u64, refunds: u64, prev: Part, floor: u64) -> SyncItem {
    SyncItem {
        entity: 7,
        limit: 0,
        op: SyncOp::Window {
            epochs: [EPOCH, EPOCH - 1],
            parts: [Part { hits, refunds }, prev],
            floors: [floor, 0],
            ttl_ms: 120_000,
        },
    }
}

fn key(epoch: u64) -> String {
    format!("sluice:v2:{{{:032x}}}:0:{epoch}", 7)
}

/// A field of the counter of `epoch` (`None`: absent).
fn field(redis: &RedisServer, epoch: u64, name: &str) -> Option<i64> {
    let v = redis.cli(&["HGET", &key(epoch), name]);
    (!v.trim().is_empty()).then(|| v.trim().parse().unwrap())
}

fn id(replica: u64) -> String {
    format!("{replica:016x}")
}

#[test]
fn refunds_past_the_count_are_kept_out_once_on_redis_as_in_memory() {
    let redis = RedisServer::start();
    let rt = runtime();
    let shard = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let memory = MemoryStore::default();
    let none = Part::default();
    let both = |replica, it: SyncItem| {
        let want = rt.block_on(memory.sync(replica, &[it])).unwrap()[0];
        let got = rt.block_on(shard.sync(replica, &[it])).unwrap()[0];
        assert_eq!(got, want, "redis and memory, {replica}: {it:?}");
        got
    };
    // Replicas 1 and 2 hold 5 each; each then gives all 10 back (a release retried through
    // the other replica). The first takes the count to 0; the second finds nothing to give
    // back, where it took the count to -10.
    assert_eq!(both(1, state(5, 0, none, 0))[0], 5);
    assert_eq!(both(2, state(5, 0, none, 5))[0], 10);
    assert_eq!(both(1, state(5, 10, none, 10))[0], 0);
    assert_eq!(both(2, state(5, 10, none, 10))[0], 0);
    assert_eq!(memory.total(7, 0, EPOCH), 0);
    let b = id(2);
    assert_eq!(
        [&b, &format!("{b}-"), &format!("{b}+")].map(|f| field(&redis, EPOCH, f)),
        [Some(5), Some(-10), Some(10)]
    );
    // Replica 3 holds 4. Replica 2's statement resent and replica 1's older one arriving
    // late find more in the count now, and apply nothing.
    assert_eq!(both(3, state(4, 0, none, 0))[0], 4);
    assert_eq!(both(2, state(5, 10, none, 0))[0], 4);
    assert_eq!(both(1, state(5, 3, none, 4))[0], 4);
    // Replica 2's next refunds are judged on the count they find: 2 of 2.
    assert_eq!(both(2, state(5, 12, none, 4))[0], 2);
    // A replica's hits and refunds reaching the store in one call (the calls before it
    // lost): its own hits count before its refunds. 3 hits, 5 refunds on a count of 2: 0.
    assert_eq!(both(4, state(3, 5, none, 2))[0], 0);
    assert_eq!(field(&redis, EPOCH, &format!("{}+", id(4))), None);
    // Out of order: a later statement, then an earlier one, which changes nothing.
    assert_eq!(both(5, state(10, 4, none, 0))[0], 6);
    assert_eq!(both(5, state(6, 2, none, 6))[0], 6);
    // The previous epoch's counter (a concurrency limit's releases go there first) floors
    // at zero on its own: 3 held, 8 released, then 3 more released through another replica.
    let prev = |hits, refunds| Part { hits, refunds };
    assert_eq!(both(6, state(0, 0, prev(3, 0), 6)), [6, 3]);
    assert_eq!(both(6, state(0, 0, prev(3, 8), 6)), [6, 0]);
    assert_eq!(both(7, state(0, 0, prev(0, 3), 6)), [6, 0]);
    assert_eq!(memory.total(7, 0, EPOCH - 1), 0);
    assert_eq!(field(&redis, EPOCH - 1, &format!("{}+", id(6))), Some(5));
    // Counted once each: every field sums to the count.
    let sum: i64 = redis
        .cli(&["HVALS", &key(EPOCH)])
        .lines()
        .map(|v| v.trim().parse::<i64>().unwrap())
        .sum();
    assert_eq!(sum, 6);
}

/// The previous script's call for entity 7 by `replica`: its `hits` and `refunds` in the
/// current epoch, floor 0. Returns both epochs' sums as it answers them (signed).
fn previous(redis: &RedisServer, replica: u64, hits: u64, refunds: u64) -> [i64; 2] {
    let (curr, prev) = (key(EPOCH), key(EPOCH - 1));
    let args = [
        id(replica),
        "120000".into(),
        hits.to_string(),
        "0".into(),
        refunds.to_string(),
        "0".into(),
        "0".into(),
        "0".into(),
    ];
    let mut cmd = vec!["EVAL", PREVIOUS_SYNC, "2", &curr, &prev];
    cmd.extend(args.iter().map(String::as_str));
    let out: Vec<i64> = redis
        .cli(&cmd)
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    [out[0], out[1]]
}

#[test]
fn old_and_new_sync_scripts_read_one_counter_each_as_the_other_wrote_it() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let new = |replica, hits, refunds| {
        let it = state(hits, refunds, Part::default(), 0);
        rt.block_on(store.sync(replica, &[it])).unwrap()[0][0]
    };
    // Old replicas count 10, give 3 back, and count 4: 11.
    assert_eq!(previous(&redis, 1, 10, 3)[0], 7);
    assert_eq!(previous(&redis, 2, 4, 0)[0], 11);
    // A new replica reads 11, and gives back 20: 11 of them apply.
    assert_eq!(new(3, 0, 0), 11);
    assert_eq!(new(3, 0, 20), 0);
    // An old replica reads the count the new one left (the sum of every field), and counts
    // from there; the new one reads that.
    assert_eq!(previous(&redis, 2, 4, 0)[0], 0);
    assert_eq!(previous(&redis, 1, 12, 3)[0], 2);
    assert_eq!(new(3, 0, 20), 2);
}

/// A bucket call for entity 8 by a replica at `NOW_MS`: `delta` tokens (negative: given
/// back), all of them the run, having stated `stated` so far. 10 a second, a burst of 10.
fn bucket(delta: i64, stated: [u32; 2]) -> SyncItem {
    SyncItem {
        entity: 8,
        limit: 0,
        op: SyncOp::Bucket {
            delta,
            spend: delta,
            now_us: NOW_MS * 1000,
            since_us: NOW_MS * 1000,
            interval_ns: 100_000_000,
            max_ahead_ns: 1_000_000_000,
            floor_us: 0,
            ttl_ms: 60_000,
            stated,
        },
    }
}

#[test]
fn a_give_back_past_what_was_spent_fills_the_bucket_no_fuller_than_full() {
    let redis = RedisServer::start();
    let rt = runtime();
    let shard = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let memory = MemoryStore::default();
    let both = |replica, it: SyncItem| {
        let want = rt.block_on(memory.sync(replica, &[it])).unwrap()[0];
        let got = rt.block_on(shard.sync(replica, &[it])).unwrap()[0];
        assert_eq!(got, want, "redis and memory, {replica}: {it:?}");
        got
    };
    let now_us = NOW_MS * 1000;
    // Replicas 1 and 2 spend 5 each: the bucket is empty, full again in a second.
    assert_eq!(both(1, bucket(5, [5, 0])), [now_us + 500_000, 5]);
    assert_eq!(both(2, bucket(5, [5, 0])), [now_us + 1_000_000, 10]);
    // Each gives 10 back, and resends it: full, and no fuller. (Below now, a `tat` would
    // hold no more tokens, but the run of a later spend starts from the later of the two.)
    assert_eq!(both(1, bucket(-10, [5, 10])), [now_us, 0]);
    assert_eq!(both(2, bucket(-10, [5, 10])), [now_us, 0]);
    assert_eq!(both(2, bucket(-10, [5, 10])), [now_us, 0]);
    // A burst's worth is all it holds: 10 from full empties it.
    assert_eq!(both(1, bucket(10, [15, 10])), [now_us + 1_000_000, 10]);
}
