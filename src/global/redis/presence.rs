//! The RLQS streams of the fleet per counter, on Redis (a trip's `Publish`,
//! [`ShardStore::round_trip`], of [`super::RedisStore`]): each replica publishes how many Envoy streams it holds on a counter
//! and their demand, and reads what the others publish, once a tick (`global/presence.rs`).
//!
//! # Data model (key version 1)
//! A counter's presence is a hash at `{prefix}sluice:q1:{<entity>}` (the entity in 32 hex
//! digits, the same hash tag as the sync's keys, `sync.rs`, so a cluster keeps it in the
//! entity's slot) with one field per replica that holds streams on it: the field named by its
//! id (16 hex digits) holds `"<streams> <demand> <expires>"`, all integers: its streams, their
//! demand in milli-requests/s (Redis turns a Lua number into an integer, so no fractions:
//! `Presence::demand_milli`, at most 10^12), and when the field stops counting (Unix ms, the
//! replica's fleet clock: its offset from Redis `TIME` is corrected, `sync/clock_offset.rs`).
//!
//! `presence.lua` (one call per chunk of [`CHUNK`] items, per item on a cluster): sets this
//! replica's field (or removes it, when it has no stream left there), removes every field that
//! expired (or that it cannot read), sets the key's expiry to the longest-lived field left (a
//! hash with no field left is no key), and returns per item two integers: the other replicas'
//! streams and demand, summed. Its twin is `publish` in `global/memory/mod.rs`, checked
//! against it on a real Redis (`tests/redis/presence_store.rs`).
//!
//! Costs. One field per replica with streams on the counter (listpack-encoded up to 128
//! fields); a call reads them all (`HGETALL`): O(replicas) per item, at most the fleet. A
//! field lasts three ticks unrefreshed, so a replica that died stops counting within three
//! ticks; a replica that stops cleanly removes its fields at once (`global/presence.rs`).

use deadpool_redis::redis::{self, Value};

use super::error::backend;
use super::keys::field;
use super::pool::RedisPool;
use super::script::{self, Call, Lua};
use crate::global::{Others, Presence, StoreError};

/// Publishes and reads presence (see the module docs). KEYS: one hash per item. ARGV: the
/// replica's field, now (ms), when its fields expire (ms), then two per item: streams and
/// demand (milli-requests/s). Returns two integers per item: the others' streams and demand.
pub(super) const PRESENCE_SCRIPT: &str = include_str!("presence.lua");

/// Items per script call: bounds the script's run time on the Redis thread.
const CHUNK: usize = 500;

/// The key of a counter's presence: version 1, a hash.
fn key(prefix: &str, entity: u128) -> String {
    format!("{prefix}sluice:q1:{{{entity:032x}}}")
}

/// The keys and arguments of a call over `items`.
fn args(
    cmd: &mut redis::Cmd,
    replica: u64,
    items: &[Presence],
    now_ms: u64,
    ttl_ms: u64,
    prefix: &str,
) {
    cmd.arg(items.len());
    for it in items {
        cmd.arg(key(prefix, it.entity));
    }
    cmd.arg(field(replica))
        .arg(now_ms)
        .arg(now_ms.saturating_add(ttl_ms.max(1)));
    for it in items {
        cmd.arg(it.streams).arg(it.demand_milli());
    }
}

/// The others' sums of a reply over `n` items.
fn others(v: &Value, n: usize) -> Result<Vec<Others>, StoreError> {
    let Value::Array(vals) = v else {
        return Err(backend(format!("unexpected presence reply {v:?}")));
    };
    if vals.len() != n * 2 {
        return Err(backend(format!(
            "presence script returned {} values for {n} items",
            vals.len()
        )));
    }
    let num = |v: &Value| match v {
        Value::Int(i) => Ok((*i).max(0) as u64),
        other => Err(backend(format!("unexpected presence value {other:?}"))),
    };
    vals.chunks(2)
        .map(|c| Ok(Others::from_milli(num(&c[0])?, num(&c[1])?)))
        .collect()
}

/// One tick's presence on a shard: a pipeline of script calls, a chunk of items each; on a
/// cluster, one call per item (a script's keys must share a slot), all in flight at once.
pub(super) async fn publish(
    pool: &RedisPool,
    lua: &Lua,
    prefix: &str,
    replica: u64,
    items: &[Presence],
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Vec<Others>, StoreError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let call = |of: &'_ [Presence]| {
        let of = of.to_vec();
        Call::new(lua, move |cmd| {
            args(cmd, replica, &of, now_ms, ttl_ms, prefix)
        })
    };
    let mut conn = pool.get().await.map_err(backend)?;
    if let Some(handle) = conn.cluster_handle() {
        let calls = items.chunks(1).map(|one| {
            let (mut c, call) = (handle.clone(), call(one));
            async move { others(&call.run(&mut c).await.map_err(backend)?, 1) }
        });
        let replies = futures_util::future::try_join_all(calls).await?;
        return Ok(replies.into_iter().flatten().collect());
    }
    let calls: Vec<Call<'_>> = items.chunks(CHUNK).map(call).collect();
    let replies = script::pipeline(&mut conn, &calls).await.map_err(backend)?;
    let mut out = Vec::with_capacity(items.len());
    for (reply, chunk) in replies.iter().zip(items.chunks(CHUNK)) {
        out.extend(others(reply, chunk.len())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counters_presence_key_shares_the_sync_keys_hash_tag() {
        assert_eq!(
            key("p:", 0xab),
            "p:sluice:q1:{000000000000000000000000000000ab}"
        );
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_an_error() {
        let ok = Value::Array(vec![Value::Int(3), Value::Int(2_500)]);
        assert_eq!(
            others(&ok, 1).unwrap(),
            vec![Others {
                streams: 3,
                demand: 2.5
            }]
        );
        assert!(others(&ok, 2).is_err());
        assert!(others(&Value::Int(1), 1).is_err());
    }
}
