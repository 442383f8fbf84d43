//! A rolling upgrade keeps one bucket: the bucket scripts of the version before the shared
//! `tat` encoding (`tests/data/previous/`, verbatim as of commit 5923709: the sync's kept `t`
//! as '%.17g' of Unix µs and spent in doubles of µs; the exact rules' already kept 'W.NNN')
//! and this version's (`global/redis/gcra.lua`: 'W.NNN', Unix µs with whole ns, for both) read
//! each other's `tat` on one real redis-server, so old and new replicas spend one bucket and
//! no key version bump is needed.

use crate::common::redis::RedisServer;
use sluice::core::gcra;
use sluice::global::exact::{ExactBucket, ExactItem, ExactStore};
use sluice::global::redis::exact::RedisExact;
use sluice::global::redis::{RedisOptions, RedisStore};
use sluice::global::{SyncItem, SyncOp};

const NOW_MS: u64 = 1_700_000_040_000;

/// 3 a second: a token every 333,333,333 ns, not a whole µs.
const T_NS: u64 = 333_333_333;

const PREVIOUS_SYNC: &str = include_str!("../data/previous/bucket.lua");
const PREVIOUS_EXACT: &str = include_str!("../data/previous/exact.lua");

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Integers of a redis-cli reply, one a line.
fn ints(out: &str) -> Vec<u64> {
    out.lines().map(|l| l.trim().parse().unwrap()).collect()
}

/// A stored `tat` read as whole ns, as `gcra.lua` parses it ('W', 'W.D' or 'W.NNN').
fn tat_ns(stored: &str) -> u64 {
    let (w, f) = stored.split_once('.').unwrap_or((stored, ""));
    let f = format!("{f:0<3}");
    w.parse::<u64>().unwrap() * 1000 + f[..3].parse::<u64>().unwrap()
}

/// A sync of entity 1's bucket (limit 0) by `replica`, as the previous version's script ran
/// it (its arguments: the interval and max ahead as decimal µs): `delta` tokens, the last
/// `spend` of them from `at`, having stated `stated` so far. Returns its `tat` (µs) and count.
fn previous_sync(redis: &RedisServer, replica: u64, delta: i64, at: u64, stated: u32) -> [u64; 2] {
    let now_us = (NOW_MS + at) * 1000;
    let args = [
        format!("{:016x}", replica),
        delta.to_string(),
        now_us.to_string(),
        now_us.to_string(),
        format!("{}", T_NS as f64 / 1000.0),
        format!("{}", (60 * T_NS) as f64 / 1000.0),
        "0".into(),
        "60000".into(),
        delta.to_string(),
        stated.to_string(),
        "0".into(),
    ];
    let key = sync_key();
    let mut cmd = vec!["EVAL", PREVIOUS_SYNC, "1", &key];
    cmd.extend(args.iter().map(String::as_str));
    let v = ints(&redis.cli(&cmd));
    [v[0], v[1]]
}

/// The same sync by this version's store.
fn sync(
    rt: &tokio::runtime::Runtime,
    store: &RedisStore,
    replica: u64,
    delta: i64,
    at: u64,
    stated: u32,
) -> [u64; 2] {
    let now_us = (NOW_MS + at) * 1000;
    let it = SyncItem {
        entity: 1,
        limit: 0,
        op: SyncOp::Bucket {
            delta,
            spend: delta,
            now_us,
            since_us: now_us,
            interval_ns: T_NS,
            max_ahead_ns: 60 * T_NS,
            floor_us: 0,
            ttl_ms: 60_000,
            stated: [stated, 0],
        },
    };
    rt.block_on(store.sync(replica, &[it])).unwrap()[0]
}

fn sync_key() -> String {
    format!("sluice:b1:{{{:032x}}}:0", 1)
}

#[test]
fn old_and_new_sync_scripts_spend_one_bucket_each_reading_the_others_tat() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = RedisStore::new(&redis.url(), &RedisOptions::default()).unwrap();
    let stored = || redis.cli(&["HGET", &sync_key(), "t"]);

    // An old replica spends 7 tokens: 2,333,333.331 µs ahead, a double of µs ('%.17g').
    let [t1, n1] = previous_sync(&redis, 1, 7, 0, 7);
    assert_eq!(n1, 7);
    let old = stored();
    assert_eq!(tat_ns(&old) / 1000, t1, "{old}");
    let decimals = old.split_once('.').map_or(0, |(_, f)| f.len());
    assert!(decimals < 3, "the old encoding: {old}");

    // A new replica reads it as it was written...
    assert_eq!(sync(&rt, &store, 2, 0, 10, 0), [t1, 7]);
    // ...and spends 3 from it, in whole ns, writing 'W.NNN'.
    let now = (NOW_MS + 20) * 1_000_000;
    let want = gcra::spend(tat_ns(&old), now, now, 3 * T_NS, 60 * T_NS);
    assert_eq!(sync(&rt, &store, 2, 3, 20, 3), [want / 1000, 10]);
    let new = stored();
    assert_eq!(new, format!("{}.{:03}", want / 1000, want % 1000));

    // The old replica reads the new encoding (to its double's quarter µs)...
    let [t3, n3] = previous_sync(&redis, 1, 0, 30, 7);
    assert!(
        t3.abs_diff(want / 1000) <= 1 && n3 == 10,
        "{t3} {n3} {want}"
    );
    // ...and spends 1 more from it: one interval further.
    let [t4, n4] = previous_sync(&redis, 1, 1, 40, 8);
    assert!(
        t4.abs_diff((want + T_NS) / 1000) <= 1 && n4 == 11,
        "{t4} {n4} {want}"
    );

    // The new replica reads what the old one wrote back, as the old one did.
    assert_eq!(sync(&rt, &store, 2, 0, 50, 3), [t4, 11]);
}

/// An exact bucket item of entity 1 (3 a second, bursts of 4) at `at`.
fn exact_item(hits: u64, at: u64) -> ExactItem {
    ExactItem {
        entity: 1,
        limit: 0,
        epoch: 0,
        window_ms: 1000,
        left_ms: 0,
        prev: sluice::core::window::Prev::Out,
        requests_per_unit: 3,
        hits,
        ttl_ms: 0,
        refund: false,
        bucket: Some(ExactBucket {
            burst: 4,
            now_us: (NOW_MS + at) * 1000,
        }),
        per_second: true,
    }
}

/// The previous exact script's check (and with `commit`, spend) of `hits` at `at`: the ns the
/// bucket owed.
fn previous_exact(redis: &RedisServer, hits: u64, at: u64, commit: bool) -> u64 {
    let key = format!("sluice:xb:{{{:032x}}}:0", 1);
    let args = [
        u8::from(commit).to_string(),
        hits.to_string(),
        "3".into(),
        T_NS.to_string(),
        ((NOW_MS + at) * 1000).to_string(),
        "2".into(),
        (4 * T_NS).to_string(),
        "0".into(),
    ];
    let mut cmd = vec!["EVAL", PREVIOUS_EXACT, "2", &key, &key];
    cmd.extend(args.iter().map(String::as_str));
    let v = ints(&redis.cli(&cmd));
    assert_eq!(v[0], 1, "fits");
    v[1]
}

#[test]
fn old_and_new_exact_scripts_spend_one_bucket_each_reading_the_others_tat() {
    let redis = RedisServer::start();
    let rt = runtime();
    let (_, store) = RedisExact::all(&[redis.url()], false, None, &RedisOptions::default())
        .unwrap()
        .remove(0);
    let owed = |hits, at, commit| {
        let r = rt
            .block_on(store.exact(&[exact_item(hits, at)], commit))
            .unwrap();
        assert!(r.fits);
        r.counts[0].owed_ns
    };
    // The old script spends 2 tokens; the new one reads them 100 ms later and spends 1.
    assert_eq!(previous_exact(&redis, 2, 0, true), 0);
    assert_eq!(owed(1, 100, true), 2 * T_NS - 100_000_000);
    // The old one reads all three, to the ns, and spends 1 more; the new one reads it.
    assert_eq!(previous_exact(&redis, 1, 200, true), 3 * T_NS - 200_000_000);
    assert_eq!(owed(0, 300, false), 4 * T_NS - 300_000_000);
}
