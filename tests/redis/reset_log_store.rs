//! The reset log on a real redis-server, standalone and as a cluster, against its in-memory
//! twin (`reset_log.lua` and `reset_append.lua` against `ResetLog`, through `MemoryStore`):
//! appends number the entries alike and trim the log to its length; a heartbeat's read
//! answers the same entries, at most its bound, the same misses once entries were trimmed
//! past the reader, and reads a log that started again (a store that lost its keys) whole.
//! A key of another type in its place leaves the heartbeat standing, with no news.

use crate::common::redis::{RedisCluster, RedisServer};
use sluice::global::memory::MemoryStore;
use sluice::global::redis::exact::RedisExact;
use sluice::global::redis::{RedisOptions, RedisStore};
use sluice::global::sync::reset_log::MAX_RESETS_PER_BEAT;
use sluice::global::{ExactStore, Heartbeat, ResetNews, ResetRead};

const NOW_MS: u64 = 1_700_000_040_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn beat(resets: ResetRead) -> Heartbeat {
    Heartbeat {
        replica: 1,
        now_ms: NOW_MS,
        ttl_ms: 8_000,
        leaving: false,
        new_generation: 5,
        resets,
    }
}

/// A Redis shard (its sync store and its exact store, which appends) beside the twin.
struct Pair {
    rt: tokio::runtime::Runtime,
    shard: RedisStore,
    exact: RedisExact,
    memory: MemoryStore,
}

impl Pair {
    /// Appends `entities` to both logs, kept to `max_len`: the newest entry's number, alike.
    fn append(&self, entities: &[u128], max_len: usize) -> u64 {
        let r = self.rt.block_on(self.exact.log_resets(entities, max_len));
        let m = self.rt.block_on(self.memory.log_resets(entities, max_len));
        assert_eq!(r.as_ref().ok(), m.as_ref().ok(), "append {entities:?}");
        r.unwrap()
    }

    /// Both logs' news for `read`, alike.
    fn read(&self, read: ResetRead) -> Option<ResetNews> {
        let r = self.rt.block_on(self.shard.heartbeat(&beat(read))).unwrap();
        let m = self
            .rt
            .block_on(self.memory.heartbeat(&beat(read)))
            .unwrap();
        assert_eq!(r.resets, m.resets, "read {read:?}");
        r.resets
    }
}

/// Appends, reads, trims and a restart, alike on `pair`; `flush` empties the Redis.
fn same_as_memory(pair: &Pair, flush: impl Fn()) {
    assert_eq!(pair.read(ResetRead::Skip), None);
    let empty = pair.read(ResetRead::Head).unwrap();
    assert_eq!((empty.head, empty.entities.len()), (0, 0));
    assert_eq!(pair.append(&[0xa, 0xb, u128::MAX], 100), 3);
    let news = pair.read(ResetRead::After(1)).unwrap();
    assert_eq!(news.entities, vec![0xb, u128::MAX]);
    assert_eq!((news.head, news.first, news.missed), (3, 2, 0));
    assert!(pair.read(ResetRead::After(3)).unwrap().entities.is_empty());
    // 300 more, the log kept to 100 (204..=303): a reader at 1 missed 202 of them.
    let more: Vec<u128> = (100..400).collect();
    assert_eq!(pair.append(&more, 100), 303);
    let news = pair.read(ResetRead::After(1)).unwrap();
    assert_eq!((news.first, news.missed), (204, 202));
    assert_eq!(news.entities, (300..400).collect::<Vec<u128>>());
    let news = pair.read(ResetRead::After(250)).unwrap();
    assert_eq!(news.entities.len(), 53);
    // A long log read from its start: at most the bound.
    let many: Vec<u128> = (0..400).collect();
    assert_eq!(pair.append(&many, 1000), 703);
    let news = pair.read(ResetRead::After(303)).unwrap();
    assert_eq!(news.entities.len() as u64, MAX_RESETS_PER_BEAT);
    assert_eq!(news.entities[0], 0);
    // The store lost its keys: the log starts again and a reader ahead of it reads it whole.
    flush();
    pair.memory.flush_all();
    assert_eq!(pair.append(&[0x77], 100), 1);
    let news = pair.read(ResetRead::After(703)).unwrap();
    assert_eq!((news.first, news.entities.clone()), (1, vec![0x77]));
}

#[test]
fn the_reset_log_reads_on_redis_as_in_memory() {
    let redis = RedisServer::start();
    let opts = RedisOptions::default();
    let pair = Pair {
        rt: runtime(),
        shard: RedisStore::new(&redis.url(), &opts).unwrap(),
        exact: RedisExact::all(&[redis.url()], false, None, &opts)
            .unwrap()
            .pop()
            .unwrap()
            .1,
        memory: MemoryStore::default(),
    };
    same_as_memory(&pair, || {
        redis.cli(&["FLUSHALL"]);
    });
    // Bytes per entry: a sequence number, a space, 32 hex digits.
    let newest = redis.cli(&["LINDEX", "sluice:resets", "0"]);
    assert_eq!(newest.trim(), format!("1 {:032x}", 0x77));
    assert_eq!(redis.cli(&["PTTL", "sluice:resets"]).trim(), "-1");
    // A key of another type in its place: the heartbeat stands, with no news.
    redis.cli(&["DEL", "sluice:resets"]);
    redis.cli(&["SET", "sluice:resets", "x"]);
    let got = pair
        .rt
        .block_on(pair.shard.heartbeat(&beat(ResetRead::After(0))));
    let got = got.unwrap();
    assert_eq!((got.live, got.resets), (1, None));
}

#[test]
fn the_reset_log_reads_on_a_redis_cluster_as_in_memory() {
    let cluster = RedisCluster::start(3);
    let opts = RedisOptions {
        prefix: "c:".into(),
        pool_size: 2,
        ..RedisOptions::default()
    };
    let seeds = cluster.seed_urls();
    let pair = Pair {
        rt: runtime(),
        shard: RedisStore::cluster(&seeds, &opts).unwrap(),
        exact: RedisExact::all(&seeds, true, None, &opts)
            .unwrap()
            .pop()
            .unwrap()
            .1,
        memory: MemoryStore::default(),
    };
    same_as_memory(&pair, || {
        cluster.cli(&["DEL", "c:sluice:resets"]);
    });
}
