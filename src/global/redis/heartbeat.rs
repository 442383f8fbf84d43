//! The replicas' heartbeats on Redis (a trip's heartbeat, [`ShardStore::round_trip`], of
//! [`super::RedisStore`]), and the store's generation they read.
//!
//! A heartbeat is a script (`heartbeat.lua`) on the sorted set `{prefix}sluice:replicas`
//! (member: the replica's id, score: when it was last seen): it drops members older than the
//! TTL and returns how many are live. One key, so one slot on a cluster. It goes in the same
//! pipeline as the tick's sync calls (`sync.rs`).
//!
//! # The generation
//! The heartbeat also reads the string `{prefix}sluice:generation`, 16 hex digits, and
//! writes the one the replica sends when there is none (`generation.lua`). It has no expiry:
//! only a Redis that lost its data (restarted without persistence, flushed, replaced by an
//! empty one at the same address, or evicting keys under `allkeys-*`) comes back without it,
//! and the replicas that read the old one then read another (`sync/health.rs` counts and logs
//! it). On a standalone shard it rides in the heartbeat's script (its second key), so it costs
//! no command; on a cluster, where the two keys' slots differ, it is a call of its own
//! (`GENERATION_SCRIPT`) beside the heartbeat, in the same round trip. One key, so on a
//! cluster it watches the master of its slot only.
//!
//! # The reset log
//! A tick's heartbeat also reads the reset log's entries after the last this replica has seen
//! (`reset_log.rs`): on a standalone shard in the same script (its third key), on a cluster
//! as a call of its own beside it. A log that does not read leaves the heartbeat alone.
//!
//! [`ShardStore::round_trip`]: crate::global::ShardStore::round_trip

use deadpool_redis::redis::Value;

use super::error::backend;
use super::pool::RedisPool;
use super::reset_log::{news_of, read_arg, read_call, reset_log_key, unread, RESET_READ_SCRIPT};
use super::script::{Call, Lua};
use crate::global::{Beat, Heartbeat, StoreError};

/// A replica's heartbeat. KEYS: the replicas' set and, on a standalone shard, the
/// generation's key and (when the beat reads it) the reset log. ARGV: replica id, now (ms),
/// the oldest last-seen still live (ms), TTL (ms), 1 when the replica leaves, the generation
/// to write where there is none, and with the log, its read and the most entries. Returns the
/// live count, or with the second key, the live count and the generation (nil when the key
/// holds something else), and with the third, the log's news (`reset_log.rs`).
const HEARTBEAT_SCRIPT: &str = concat!(
    include_str!("generation.lua"),
    include_str!("reset_log.lua"),
    include_str!("heartbeat.lua")
);

/// The generation alone, beside a cluster's heartbeat (its key is in another slot). KEYS: the
/// generation's key. ARGV: the generation to write where there is none. Returns the
/// generation (nil when the key holds something else).
const GENERATION_SCRIPT: &str = concat!(
    include_str!("generation.lua"),
    "return generation(KEYS[1], ARGV[1])\n"
);

pub(super) fn replicas_key(prefix: &str) -> String {
    format!("{prefix}sluice:replicas")
}

fn generation_key(prefix: &str) -> String {
    format!("{prefix}sluice:generation")
}

/// A shard's heartbeat scripts, its key prefix and its name (for logs).
pub(super) struct Heartbeats {
    beat: Lua,
    generation: Lua,
    resets: Lua,
    prefix: String,
    shard: String,
}

impl Heartbeats {
    pub(super) fn new(prefix: &str, shard: &str) -> Self {
        Heartbeats {
            beat: Lua::new(HEARTBEAT_SCRIPT),
            generation: Lua::new(GENERATION_SCRIPT),
            resets: Lua::new(RESET_READ_SCRIPT),
            prefix: prefix.to_owned(),
            shard: shard.to_owned(),
        }
    }

    /// The heartbeat's call; `with_generation` (a standalone shard), it reads the generation
    /// and the reset log (when the beat asks) too, and its reply is read by
    /// [`Heartbeats::reply`].
    pub(super) fn call<'a>(&'a self, beat: &'a Heartbeat, with_generation: bool) -> Call<'a> {
        let log = read_arg(beat.resets).filter(|_| with_generation);
        Call::new(&self.beat, move |cmd| {
            let keys = 1 + usize::from(with_generation) + usize::from(log.is_some());
            cmd.arg(keys).arg(replicas_key(&self.prefix));
            if with_generation {
                cmd.arg(generation_key(&self.prefix));
            }
            if log.is_some() {
                cmd.arg(reset_log_key(&self.prefix));
            }
            cmd.arg(format!("{:016x}", beat.replica))
                .arg(beat.now_ms)
                .arg(beat.now_ms.saturating_sub(beat.ttl_ms))
                .arg(beat.ttl_ms.max(1))
                .arg(u8::from(beat.leaving))
                .arg(format!("{:016x}", beat.new_generation));
            if let Some(read) = &log {
                cmd.arg(read)
                    .arg(crate::global::sync::reset_log::MAX_RESETS_PER_BEAT);
            }
        })
    }

    /// A standalone shard's heartbeat reply: the live count and the generation. A generation
    /// that does not read (its key holds something else) is only logged: the heartbeat
    /// stands, and a loss of the sync's keys goes unnoticed until the key is fixed.
    pub(super) fn reply(&self, v: &Value) -> Result<Beat, StoreError> {
        let Value::Array(both) = v else {
            return Err(backend(format!("heartbeat failed: {v:?}")));
        };
        let (live, generation, resets) = match both.as_slice() {
            [live, generation] => (live, generation, None),
            [live, generation, log] => (live, generation, news_of(log, &self.shard)),
            _ => return Err(backend(format!("unexpected heartbeat reply {v:?}"))),
        };
        Ok(Beat {
            live: live_count(live)?,
            generation: self.checked(generation_of(generation)),
            resets,
        })
    }

    /// A cluster's heartbeat: its own call (its key is in its own slot), and the generation's
    /// and the reset log's beside it, all in flight at once. A generation or a log that fails
    /// leaves the heartbeat alone.
    pub(super) async fn on_cluster(
        &self,
        pool: &RedisPool,
        beat: &Heartbeat,
    ) -> Result<Beat, StoreError> {
        let conn = pool.get().await.map_err(backend)?;
        let handle = conn
            .cluster_handle()
            .ok_or_else(|| backend("not a cluster connection"))?;
        let (mut a, mut b, mut c) = (handle.clone(), handle.clone(), handle);
        let generation = Call::new(&self.generation, |cmd| {
            cmd.arg(1)
                .arg(generation_key(&self.prefix))
                .arg(format!("{:016x}", beat.new_generation));
        });
        let read = read_arg(beat.resets);
        let log = async {
            let arg = read.as_deref()?;
            match read_call(&self.resets, &self.prefix, arg).run(&mut c).await {
                Ok(v) => news_of(&v, &self.shard),
                Err(e) => unread(&self.shard, &e),
            }
        };
        let (live, generation, resets) = futures_util::future::join3(
            self.call(beat, false).run(&mut a),
            generation.run(&mut b),
            log,
        )
        .await;
        Ok(Beat {
            live: live_count(&live.map_err(backend)?)?,
            generation: self.checked(generation.map_err(backend).and_then(|v| generation_of(&v))),
            resets,
        })
    }

    /// A generation read, or `None` with a warning.
    fn checked(&self, generation: Result<u64, StoreError>) -> Option<u64> {
        let warn = |e: &StoreError| {
            let key = generation_key(&self.prefix);
            tracing::warn!(shard = %self.shard, %key, error = %e,
                "cannot read the store's generation; a loss of the sync's keys would go unnoticed");
        };
        generation.inspect_err(warn).ok()
    }
}

fn live_count(v: &Value) -> Result<u32, StoreError> {
    match v {
        Value::Int(n) => Ok((*n).clamp(0, i64::from(u32::MAX)) as u32),
        _ => Err(backend(format!("unexpected heartbeat reply {v:?}"))),
    }
}

/// A generation as the scripts return it: 16 hex digits.
fn generation_of(v: &Value) -> Result<u64, StoreError> {
    let text = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s.as_str()),
        _ => None,
    };
    text.and_then(|t| u64::from_str_radix(t, 16).ok())
        .ok_or_else(|| backend(format!("unexpected generation {v:?}")))
}
