//! The set of replicas as a replica joining the fleet reads it ([`ShardStore::replicas`] of
//! [`super::RedisStore`], `global/join.rs`): every member of `{prefix}sluice:replicas` with
//! its score, the time its last heartbeat stated (`heartbeat.rs` writes them).
//!
//! [`ShardStore::replicas`]: crate::global::ShardStore::replicas

use deadpool_redis::redis::{self, Value};

use super::error::backend;
use super::heartbeat::replicas_key;
use super::pool::RedisPool;
use crate::global::StoreError;

/// `ZRANGE <set> 0 -1 WITHSCORES`: each member's id and score. Members that are not a
/// replica id (16 hex digits) are left out: nothing else writes the set.
pub(super) async fn read(pool: &RedisPool, prefix: &str) -> Result<Vec<(u64, u64)>, StoreError> {
    let mut conn = pool.get().await.map_err(backend)?;
    let v: Value = redis::cmd("ZRANGE")
        .arg(replicas_key(prefix))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .map_err(backend)?;
    members(&v)
}

/// The reply's members: a flat array of member and score (RESP2), or an array of pairs
/// (RESP3).
fn members(v: &Value) -> Result<Vec<(u64, u64)>, StoreError> {
    let Value::Array(items) = v else {
        return Err(backend(format!("unexpected replicas reply {v:?}")));
    };
    let flat: Vec<&Value> = items
        .iter()
        .flat_map(|item| match item {
            Value::Array(pair) => pair.iter().collect::<Vec<_>>(),
            other => vec![other],
        })
        .collect();
    Ok(flat
        .chunks_exact(2)
        .filter_map(|pair| Some((id(pair[0])?, score(pair[1])?)))
        .collect())
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        Value::Double(d) => Some(d.to_string()),
        _ => None,
    }
}

fn id(v: &Value) -> Option<u64> {
    u64::from_str_radix(&text(v)?, 16).ok()
}

fn score(v: &Value) -> Option<u64> {
    let s: f64 = text(v)?.parse().ok()?;
    (s.is_finite() && s >= 0.0).then_some(s as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_protocols_replies_read_the_same() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("00000000000000a1"),
            bulk("1700000000123"),
            bulk("not-an-id"),
            bulk("5"),
            bulk("00000000000000b2"),
            bulk("1700000000456"),
        ]);
        let resp3 = Value::Array(vec![
            Value::Array(vec![
                bulk("00000000000000a1"),
                Value::Double(1_700_000_000_123.0),
            ]),
            Value::Array(vec![
                bulk("00000000000000b2"),
                Value::Double(1_700_000_000_456.0),
            ]),
        ]);
        let want = vec![(0xa1, 1_700_000_000_123), (0xb2, 1_700_000_000_456)];
        assert_eq!(members(&resp2).unwrap(), want);
        assert_eq!(members(&resp3).unwrap(), want);
        assert!(members(&Value::Int(3)).is_err());
    }
}
