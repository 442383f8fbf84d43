//! The fleet's reset log on Redis (`global/sync/reset_log.rs` says what it is for): the list
//! `{prefix}sluice:resets`, newest entry first, each `<sequence number> <entity>`, with no
//! expiry and at most `RESET_LOG_LENGTH` entries. A reset appends to it (`reset_append.lua`)
//! after it cleared the counters, so a replica that reads an entry reads the cleared counts
//! at its next sync. The heartbeat reads it: on a standalone shard in its own script (a third
//! key), on a cluster, where the log's slot is its own, as a call beside it
//! (`heartbeat.rs`). One key, so on a cluster it lives on the master of its slot.

use deadpool_redis::redis::Value;

use super::error::backend;
use super::pool::RedisPool;
use super::script::{Call, Lua};
use crate::global::sync::reset_log::{ResetNews, ResetRead, MAX_RESETS_PER_BEAT};
use crate::global::sync::store::StoreError;

/// Appends entries and trims the log. KEYS: the log. ARGV: the most entries kept, then the
/// entities. Returns the newest entry's sequence number.
pub(crate) const RESET_APPEND_SCRIPT: &str = concat!(
    include_str!("reset_log.lua"),
    include_str!("reset_append.lua")
);

/// The log's news alone, beside a cluster's heartbeat. KEYS: the log. ARGV: the read
/// (`''`: where the log is; else the last sequence number seen), the most entries.
pub(super) const RESET_READ_SCRIPT: &str = concat!(
    include_str!("reset_log.lua"),
    "return reset_news(KEYS[1], ARGV[1], tonumber(ARGV[2]))\n"
);

/// The log's key.
pub(super) fn reset_log_key(prefix: &str) -> String {
    format!("{prefix}sluice:resets")
}

/// A read's argument as the scripts take it; `None` for no read.
pub(super) fn read_arg(read: ResetRead) -> Option<String> {
    match read {
        ResetRead::Skip => None,
        ResetRead::Head => Some(String::new()),
        ResetRead::After(seen) => Some(seen.to_string()),
    }
}

/// The cluster's read call (`RESET_READ_SCRIPT`).
pub(super) fn read_call<'a>(lua: &'a Lua, prefix: &'a str, arg: &'a str) -> Call<'a> {
    Call::new(lua, move |cmd| {
        cmd.arg(1)
            .arg(reset_log_key(prefix))
            .arg(arg)
            .arg(MAX_RESETS_PER_BEAT);
    })
}

/// A read's reply: `{head, first, missed, entity...}`; `None` (with a warning) when the key
/// holds something else or the reply does not read, so the heartbeat stands.
pub(super) fn news_of(v: &Value, shard: &str) -> Option<ResetNews> {
    parse(v).or_else(|| unread(shard, &format!("unexpected reply {v:?}")))
}

/// A read that failed (`why`): logged, and no news.
pub(super) fn unread(shard: &str, why: &dyn std::fmt::Display) -> Option<ResetNews> {
    tracing::warn!(%shard, error = %why,
        "cannot read the reset log; this replica learns of resets at its next sync of each key");
    None
}

fn parse(v: &Value) -> Option<ResetNews> {
    let Value::Array(vals) = v else {
        return None;
    };
    let int = |v: &Value| match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    };
    let [head, first, missed, rest @ ..] = vals.as_slice() else {
        return None;
    };
    let entities = rest
        .iter()
        .take(MAX_RESETS_PER_BEAT as usize)
        .map(|e| match e {
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| u128::from_str_radix(t, 16).ok()),
            _ => None,
        })
        .collect::<Option<Vec<u128>>>()?;
    Some(ResetNews {
        head: int(head)?,
        first: int(first)?,
        entities,
        missed: int(missed)?,
    })
}

/// Appends an entry per entity of `entities` to the log of `pool`, keeping its newest
/// `max_len`. Returns the newest entry's sequence number.
///
/// # Errors
/// The call failed (the counters were reset all the same; a retry resets them again).
pub(crate) async fn append(
    pool: &RedisPool,
    lua: &Lua,
    prefix: &str,
    entities: &[u128],
    max_len: usize,
) -> Result<u64, StoreError> {
    if entities.is_empty() {
        return Ok(0);
    }
    let mut conn = pool.get().await.map_err(backend)?;
    let call = Call::new(lua, |cmd| {
        cmd.arg(1).arg(reset_log_key(prefix)).arg(max_len.max(1));
        for e in entities {
            cmd.arg(format!("{e:032x}"));
        }
    });
    match call.run(&mut conn).await.map_err(backend)? {
        Value::Int(head) => Ok(head.max(0) as u64),
        v => Err(StoreError::reply(format!(
            "unexpected reset log reply {v:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_reply_reads_as_news_and_anything_else_as_none() {
        let v = Value::Array(vec![
            Value::Int(9),
            Value::Int(8),
            Value::Int(2),
            bulk("000000000000000000000000000000ab"),
            bulk("000000000000000000000000000000cd"),
        ]);
        assert_eq!(
            news_of(&v, "s"),
            Some(ResetNews {
                head: 9,
                first: 8,
                entities: vec![0xab, 0xcd],
                missed: 2
            })
        );
        assert_eq!(news_of(&Value::Nil, "s"), None);
        let bad = Value::Array(vec![
            Value::Int(1),
            Value::Int(1),
            Value::Int(0),
            bulk("zz"),
        ]);
        assert_eq!(news_of(&bad, "s"), None);
    }
}
