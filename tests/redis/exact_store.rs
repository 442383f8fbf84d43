//! The exact rules' Redis store against its Rust twin: the same random sequence of exact calls
//! (fixed and sliding windows, token buckets and concurrency limits mixed, checks and
//! commits, refunds and releases, limits of 0) gets the same replies from the Lua script on a real redis-server, standalone and as a
//! cluster, as from `exact::apply` (the in-memory store's exact path, which the exact rules'
//! unit tests and the prior run on). Every count and every nanosecond a bucket owes agree.

use crate::common::redis::{RedisCluster, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::core::window::Prev;
use sluice::global::exact::{ExactBucket, ExactItem, ExactStore};
use sluice::global::memory::MemoryStore;
use sluice::global::redis::exact::RedisExact;
use sluice::global::redis::RedisOptions;

/// Three seconds before a minute starts: the calls cross an epoch, so sliding windows weigh
/// a previous epoch.
const START_MS: u64 = 1_700_000_040_000 - 3_000;

/// A window's length; its keys expire after two (real time: far beyond a case's run).
const WINDOW_MS: u64 = 60_000;

/// A bucket refills `rpu` an hour: a token is 10 to 60 minutes, so what a bucket owes is 0
/// or far beyond the test's few seconds, and its key (kept until full, in real time) never
/// expires during a case.
const BUCKET_WINDOW_MS: u64 = 3_600_000;

/// One item: `(entity, kind, requests per unit, hits, refund, burst)`; the kind is the limit
/// index (0: fixed window, 1: sliding window, 2: token bucket, 3: concurrency), so a key keeps
/// its kind.
type Spec = (u8, u8, u32, u64, bool, u32);

/// One call: ms since the previous one, commit, its items.
type Call = (u64, bool, Vec<Spec>);

fn item((entity, kind, rpu, hits, refund, burst): Spec, now_ms: u64) -> ExactItem {
    let bucket = kind == 2;
    let window_ms = if bucket { BUCKET_WINDOW_MS } else { WINDOW_MS };
    ExactItem {
        entity: u128::from(entity),
        limit: kind,
        epoch: now_ms / window_ms,
        window_ms,
        left_ms: window_ms - now_ms % window_ms,
        prev: match kind {
            1 => Prev::Decays,
            3 => Prev::Whole,
            _ => Prev::Out,
        },
        requests_per_unit: rpu,
        hits,
        ttl_ms: 2 * window_ms,
        refund,
        bucket: bucket.then_some(ExactBucket {
            burst,
            now_us: now_ms * 1000,
        }),
        per_second: false,
    }
}

fn calls(entities: u8) -> impl Strategy<Value = Vec<Call>> {
    let spec = (
        0..entities,
        0u8..4,
        0u32..6,
        0u64..4,
        prop::bool::weighted(0.2),
        1u32..5,
    );
    let call = (
        0u64..800,
        prop::bool::weighted(0.8),
        prop::collection::vec(spec, 1..5),
    );
    prop::collection::vec(call, 1..16)
}

/// Runs `calls` on `store` and on a fresh memory store, in order, time moving forward; every
/// reply must be the same.
async fn same_as_memory(store: &RedisExact, calls: &[Call]) {
    let memory = MemoryStore::default();
    let mut now_ms = START_MS;
    for (step, commit, specs) in calls {
        now_ms += step;
        let items: Vec<ExactItem> = specs.iter().map(|s| item(*s, now_ms)).collect();
        let want = memory.exact(&items, *commit).await.unwrap();
        let got = store.exact(&items, *commit).await.unwrap();
        assert_eq!(got, want, "commit {commit} at {now_ms}: {items:#?}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn options(case: u32) -> RedisOptions {
    RedisOptions {
        // Each case on its own keys.
        prefix: format!("case{case}:"),
        pool_size: 2,
        ..RedisOptions::default()
    }
}

#[test]
fn a_redis_shard_decides_exact_items_as_their_rust_twin_does() {
    let redis = RedisServer::start();
    let rt = runtime();
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0);
    runner
        .run(&calls(3), |calls| {
            n.set(n.get() + 1);
            let (_, store) = RedisExact::all(&[redis.url()], false, None, &options(n.get()))
                .unwrap()
                .remove(0);
            // Every other case starts with the script flushed: the NOSCRIPT path.
            if n.get().is_multiple_of(2) {
                redis.cli(&["SCRIPT", "FLUSH"]);
            }
            rt.block_on(same_as_memory(&store, &calls));
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_redis_cluster_decides_exact_items_as_their_rust_twin_does() {
    let cluster = RedisCluster::start(3);
    let rt = runtime();
    let mut runner = TestRunner::new(Config {
        cases: 12,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0);
    // On a cluster a call holds one entity's keys (they share a slot): one entity a call,
    // a different one from case to case, so the calls go to different masters.
    runner
        .run(&calls(1), |calls| {
            n.set(n.get() + 1);
            let (_, store) = RedisExact::all(&cluster.seed_urls(), true, None, &options(n.get()))
                .unwrap()
                .remove(0);
            let entity = (n.get() % 200) as u8;
            let calls: Vec<Call> = calls
                .into_iter()
                .map(|(step, commit, specs)| {
                    let specs = specs.into_iter().map(|s| (entity, s.1, s.2, s.3, s.4, s.5));
                    (step, commit, specs.collect())
                })
                .collect();
            rt.block_on(same_as_memory(&store, &calls));
            Ok(())
        })
        .unwrap();
}

/// The cluster case's mismatch (Redis `curr` 1, the twin 2, after a commit), replayed: two
/// refunds of one counter in a call each take back at most what the call read, and together
/// took the script's counter below 0 where the twin's stops at 0; the next commit then
/// counted from -1. (The cluster case's calls hold one entity, so its items repeat a key far
/// more often than the standalone case's.)
#[test]
fn two_refunds_of_one_counter_in_a_call_leave_it_at_0_as_the_twin_does() {
    let redis = RedisServer::start();
    let rt = runtime();
    let (_, store) = RedisExact::all(&[redis.url()], false, None, &options(0))
        .unwrap()
        .remove(0);
    let calls: Vec<Call> = vec![
        (0, true, vec![(0, 0, 5, 1, false, 1)]),
        (10, true, vec![(0, 0, 5, 1, true, 1), (0, 0, 5, 1, true, 1)]),
        (10, true, vec![(0, 0, 5, 2, false, 1)]),
        (10, false, vec![(0, 0, 5, 0, false, 1)]),
    ];
    rt.block_on(same_as_memory(&store, &calls));
}

/// A concurrency limit of 3 across the minute: two acquired before it, one after (the two
/// still count: a fourth is over); a release of two takes the earlier minute's two, one of
/// four empties the count, and then 3 fit, 4 do not; all as the twin does.
#[test]
fn a_concurrency_limit_counts_and_releases_across_epochs_as_the_twin_does() {
    let redis = RedisServer::start();
    let rt = runtime();
    let (_, store) = RedisExact::all(&[redis.url()], false, None, &options(0))
        .unwrap()
        .remove(0);
    let acquire = |hits| (0, 3, 3, hits, false, 1);
    let release = |hits| (0, 3, 3, hits, true, 1);
    let calls: Vec<Call> = vec![
        (0, true, vec![acquire(2)]),
        (3_500, true, vec![acquire(1)]),
        (10, true, vec![acquire(1)]),
        (10, true, vec![release(2)]),
        (10, true, vec![acquire(2)]),
        (10, true, vec![release(4)]),
        (10, false, vec![acquire(3)]),
        (10, false, vec![acquire(4)]),
    ];
    rt.block_on(same_as_memory(&store, &calls));
    let memory = MemoryStore::default();
    let mut now_ms = START_MS;
    let mut over = Vec::new();
    for (step, commit, specs) in &calls {
        now_ms += step;
        let items: Vec<ExactItem> = specs.iter().map(|s| item(*s, now_ms)).collect();
        over.push(!rt.block_on(memory.exact(&items, *commit)).unwrap().fits);
    }
    // The fourth acquisition (after the minute turned) is over; after the releases 3 fit, 4 do
    // not.
    assert_eq!(over, [false, false, true, false, false, false, false, true]);
}
