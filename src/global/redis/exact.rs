//! Exact rules on Redis: the [`ExactStore`] of standalone shards and of Redis Cluster. One Lua
//! script call per request and shard reads every exact key of the request, and counts them all
//! only when all fit (the steps of `exact::apply`, atomically on the Redis thread).
//!
//! Keys are `{prefix}sluice:x:{<entity, 32 hex digits>}:<limit index>:<epoch>`: the `x:` keeps
//! them apart from the background sync's `{prefix}sluice:v2:{<entity>}:…` counters, and the hash
//! tag keeps an entity's keys in one cluster slot. On a cluster the keys of different entities
//! are in different slots, so a request's calls there are one per entity. A token bucket's key
//! is `{prefix}sluice:xb:{<entity>}:<limit index>` (its `tat`, see [`EXACT_SCRIPT`]), in the
//! same slot as the entity's window keys, so a rule with both is still one call.

use deadpool_redis::redis::{self, Value};

use super::error::backend;
pub use super::keys::{exact_bucket_key, exact_key};
use super::pool::{OpenError, RedisPool};
use super::script::{Call, Lua};
use super::{RedisOptions, SentinelMaster};
use crate::core::window::Prev;
use crate::global::exact::bucket as exact_bucket;
use crate::global::exact::{
    ExactCount, ExactFuture, ExactItem, ExactReply, ExactStore, LogFuture, ResetFuture, ResetItem,
};
use crate::global::sync::store::StoreError;

/// KEYS: two per item (a window: current epoch, previous epoch; a bucket: its key twice).
/// ARGV[1]: commit (1/0); then seven per item: hits, limit, window ms, ms left in the epoch,
/// mode (0 fixed, 1 sliding, 2 bucket, 3 concurrency), ttl ms, refund (1/0); a bucket has its interval (ns)
/// in place of the window, the request's time (Unix µs) in place of the ms left, and its
/// capacity (ns) in place of the ttl.
/// Returns `{fits, a₁, b₁, over₁, a₂, …}`, read before counting: a window's `prev`, `curr`;
/// a bucket's ns owed (`tat − now`, at least 0) and 0.
/// `floor(prev × left / window)` is exact while the product stays under 2^53 (a count under
/// 2^14 with the longest window; any count with windows up to a day below 10^8).
///
/// A bucket's key holds its `tat` as Unix µs with three decimals (`W.NNN`, whole
/// nanoseconds), as the sync's buckets do: the shared prelude (`global/redis/gcra.lua`, which
/// comes first) splits it so that every step is integer arithmetic on what the bucket owes,
/// exact while that stays under 2^53 ns (104 days), as local mode's decision is
/// (`core/gcra.rs`); a plain double of Unix µs would round each spend to a quarter µs and
/// drift. It expires when the bucket is full again, plus a margin; a full bucket's key is
/// deleted.
const EXACT_SCRIPT: &str = concat!(include_str!("gcra.lua"), include_str!("exact.lua"));

/// The keys and arguments of the script's call for `items`.
fn args(cmd: &mut redis::Cmd, prefix: &str, items: &[ExactItem], commit: bool) {
    cmd.arg(items.len() * 2);
    for it in items {
        if it.bucket.is_some() {
            let key = exact_bucket_key(prefix, it.entity, it.limit);
            cmd.arg(&key).arg(key);
            continue;
        }
        cmd.arg(exact_key(prefix, it.entity, it.limit, it.epoch))
            .arg(exact_key(
                prefix,
                it.entity,
                it.limit,
                it.epoch.saturating_sub(1),
            ));
    }
    cmd.arg(u8::from(commit));
    for it in items {
        cmd.arg(it.hits.min(1 << 32)).arg(it.requests_per_unit);
        match it.bucket {
            Some(b) => {
                let g = exact_bucket::geometry(it);
                cmd.arg(g.interval_ns)
                    .arg(b.now_us)
                    .arg(2)
                    .arg(g.capacity_ns);
            }
            None => {
                let mode = match it.prev {
                    Prev::Out => 0,
                    Prev::Decays => 1,
                    Prev::Whole => 3,
                };
                cmd.arg(it.window_ms)
                    .arg(it.left_ms)
                    .arg(mode)
                    .arg(it.ttl_ms);
            }
        }
        cmd.arg(u8::from(it.refund));
    }
}

/// Decodes the script's reply for `items`.
fn reply(v: &Value, items: &[ExactItem]) -> Result<ExactReply, StoreError> {
    let n = items.len();
    let Value::Array(vals) = v else {
        return Err(backend(format!("unexpected exact script reply {v:?}")));
    };
    if vals.len() != 1 + 3 * n {
        return Err(backend(format!(
            "exact script returned {} values for {n} items",
            vals.len()
        )));
    }
    let num = |v: &Value| match v {
        Value::Int(i) => (*i).max(0) as u64,
        _ => 0,
    };
    Ok(ExactReply {
        fits: num(&vals[0]) == 1,
        counts: vals[1..]
            .chunks(3)
            .zip(items)
            .map(|(c, it)| match it.bucket {
                Some(_) => ExactCount {
                    owed_ns: num(&c[0]),
                    over: num(&c[2]) == 1,
                    ..ExactCount::default()
                },
                None => ExactCount {
                    prev: num(&c[0]),
                    curr: num(&c[1]),
                    over: num(&c[2]) == 1,
                    owed_ns: 0,
                },
            })
            .collect(),
    })
}

/// Exact calls to one shard (a standalone server, a Sentinel deployment's master, or a Redis
/// Cluster, where a call holds one entity's keys: they share a slot), on a pool of their own
/// (a request never waits behind a sync tick's connection).
pub struct RedisExact {
    pool: RedisPool,
    prefix: String,
    script: Lua,
    /// An operator's reset (`global/redis/reset.rs`).
    reset: Lua,
    /// The reset log's append (`global/redis/reset_log.rs`).
    reset_log: Lua,
}

impl RedisExact {
    /// The exact stores of one Redis setting, with their names (the sync's shards' names):
    /// a standalone server per URL, the master `sentinel` names, or the cluster (normalized
    /// URLs). Connections are made lazily.
    ///
    /// # Errors
    /// When a URL is unusable.
    pub fn all(
        urls: &[String],
        cluster: bool,
        sentinel: Option<&SentinelMaster>,
        opts: &RedisOptions,
    ) -> Result<Vec<(String, RedisExact)>, OpenError> {
        Ok(RedisPool::open(urls, cluster, sentinel, opts)?
            .into_iter()
            .map(|s| (s.name, Self::on(s.pool, opts)))
            .collect())
    }

    /// Exact calls on `pool`.
    fn on(pool: RedisPool, opts: &RedisOptions) -> Self {
        RedisExact {
            pool,
            prefix: opts.prefix.clone(),
            script: Lua::new(EXACT_SCRIPT),
            reset: Lua::new(super::reset::RESET_SCRIPT),
            reset_log: Lua::new(super::reset_log::RESET_APPEND_SCRIPT),
        }
    }
}

impl ExactStore for RedisExact {
    fn exact<'a>(&'a self, items: &'a [ExactItem], commit: bool) -> ExactFuture<'a> {
        Box::pin(async move {
            let mut conn = self.pool.get().await.map_err(backend)?;
            let call = Call::new(&self.script, |cmd| args(cmd, &self.prefix, items, commit));
            let v = call.run(&mut conn).await.map_err(backend)?;
            reply(&v, items)
        })
    }

    fn group(&self, entity: u128) -> u128 {
        if self.pool.is_cluster() {
            entity
        } else {
            0
        }
    }

    /// The entity's sync counters and exact keys alike (`global/redis/reset.rs`).
    fn reset<'a>(&'a self, items: &'a [ResetItem]) -> ResetFuture<'a> {
        Box::pin(super::reset::reset(
            &self.pool,
            &self.reset,
            &self.prefix,
            items,
        ))
    }

    /// `reset_log.rs`.
    fn log_resets<'a>(&'a self, entities: &'a [u128], max_len: usize) -> LogFuture<'a> {
        Box::pin(super::reset_log::append(
            &self.pool,
            &self.reset_log,
            &self.prefix,
            entities,
            max_len,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command an exact call of `it` sends, as strings.
    fn sent(it: ExactItem) -> Vec<String> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("sha");
        args(&mut cmd, "p:", &[it], true);
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn exact_keys_are_apart_from_the_sync_keys_and_keep_an_entity_in_one_slot() {
        assert_eq!(
            exact_key("p:", 0xab, 1, 10),
            "p:sluice:x:{000000000000000000000000000000ab}:1:10"
        );
        let it = ExactItem {
            entity: 0xab,
            limit: 0,
            epoch: 10,
            window_ms: 60_000,
            left_ms: 30_000,
            prev: Prev::Decays,
            requests_per_unit: 5,
            hits: 1,
            ttl_ms: 120_000,
            refund: false,
            bucket: None,
            per_second: false,
        };
        let args = sent(it);
        assert_eq!(
            args,
            [
                "EVALSHA",
                "sha",
                "2",
                "p:sluice:x:{000000000000000000000000000000ab}:0:10",
                "p:sluice:x:{000000000000000000000000000000ab}:0:9",
                "1",
                "1",
                "5",
                "60000",
                "30000",
                "1",
                "120000",
                "0"
            ]
        );
    }

    #[test]
    fn a_bucket_item_sends_its_key_twice_its_interval_time_and_capacity() {
        assert_eq!(
            exact_bucket_key("p:", 0xab, 2),
            "p:sluice:xb:{000000000000000000000000000000ab}:2"
        );
        // 3 a second, bursts of 4: a token every 333,333,333 ns.
        let it = ExactItem {
            entity: 0xab,
            limit: 2,
            epoch: 0,
            window_ms: 1000,
            left_ms: 500,
            prev: Prev::Out,
            requests_per_unit: 3,
            hits: 1,
            ttl_ms: 2000,
            refund: true,
            bucket: Some(crate::global::exact::ExactBucket {
                burst: 4,
                now_us: 1_700_006_400_000_000,
            }),
            per_second: true,
        };
        let args = sent(it);
        let key = "p:sluice:xb:{000000000000000000000000000000ab}:2";
        assert_eq!(
            args,
            [
                "EVALSHA",
                "sha",
                "2",
                key,
                key,
                "1",
                "1",
                "3",
                "333333333",
                "1700006400000000",
                "2",
                "1333333332",
                "1"
            ]
        );
    }

    #[test]
    fn the_script_keeps_a_bucket_key_for_the_margin_the_docs_state() {
        let margin = format!("+ {})", exact_bucket::EXPIRY_MARGIN_MS);
        assert!(EXACT_SCRIPT.contains(&margin), "{margin}");
    }
}
