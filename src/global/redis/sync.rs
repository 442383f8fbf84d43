//! The Redis [`ShardStore`]s of global mode: standalone shards (one deadpool pool each) and
//! Redis Cluster. One Lua script states the replica's parts of a whole tick's counters and
//! returns the counters.
//!
//! # Data model (key version 2)
//! A counter of (entity, limit, epoch) is a hash at
//! `{prefix}sluice:v2:{<entity>}:<limit>:<epoch>` (the hash tag keeps an entity's keys in one
//! cluster slot) with one part per replica: the field named by its id (16 hex digits) holds
//! its hits; once it refunded any, the field `<id>-` holds its refunds as a negative
//! number, and once some of them were kept out (below), `<id>+` holds how many; the count is
//! the sum of every field. A call states the replica's part whole (its hits and refunds in
//! the epoch so far, `Part`), and the script keeps the larger of what a field holds and what
//! the call says (the smaller, for the negative refunds field); applies the refunds the call
//! adds only as far as the count holds hits, this call's included, and keeps the rest out
//! (`core/window/held.rs`, `Held::state`); sets the expiry (two windows) when a write finds
//! the key without one, i.e. when the script created it; and returns the sum of the fields,
//! but never less than the count the replica last read (its *floor*) less the refunds the
//! key applied. A read (nothing counted) writes nothing.
//!
//! Why refunds are kept out: a replica gives back what its own view of the count holds, and
//! two replicas can give back the same hits (a release retried through another replica, two
//! settles of one reservation). Summed whole they took the count below zero (10 places held,
//! 10 released through each of two replicas: -10), and the fleet admitted the limit again
//! on top (20 of 40 acquisitions on 10 places). Applied only as far as the count holds, a
//! release frees at most what was taken, fleet-wide, as in local mode and with `exact: true`.
//! Each refund is judged once, when the script first sees it, and what it kept out stays
//! kept out, so a resent or late statement still applies nothing twice. The price is after
//! a Redis restart: a replica that restates its refunds before another restated the hits
//! they gave back has them kept out, and the count errs high until the key expires.
//!
//! Why a floor, less refunds: the sum drops for two reasons. A refund (Envoy's
//! `is_negative_hits`) takes it down, and every replica must see that, or a key that a
//! refund took back under its limit stays over on them until its window ends (the bug of
//! envoyproxy/ratelimit's over-limit cache, PR #1230). A Redis that restarted empty takes it
//! down too, until each replica restated its part, and no replica should read that as room.
//! A healthy key's sum is never below the floor less its applied refunds (hits only grow),
//! so the floor changes nothing there; a lost key reads as the floor, less the refunds
//! applied since it was restated. Refunds kept out never took anything from the count the
//! floor was read on, so they do not lower it.
//!
//! Why stated parts and not `HINCRBY`: a call that timed out may still run in Redis, and its
//! hits go again with the next call; an increment would count them twice (with Redis slower
//! than the timeout for a few seconds, 70 hits became 150–170, and the fleet then denied
//! every request for the rest of the window). A statement is idempotent: a resend, a late
//! duplicate or two calls applied out of order leave the part at what the replica counted.
//! Hits and refunds are kept apart because each only grows, so "keep the larger" holds for
//! both; a net count goes down on a refund, and a stale statement could not be told from one.
//!
//! Why a hash: a single counter cannot be rebuilt from what each replica knows. With A at
//! 100 and B at 120, each topping the counter up to its own count gives 120, not 220; one
//! part per replica makes the statement idempotent and the sum right, and a Redis that
//! restarted empty gets every live replica's part back with its next sync of the entity.
//!
//! Costs. The sum is an `HGETALL` over the fields: O(replicas that counted the entity in that
//! epoch), at most the fleet (≤ 50 by the targets), so a chunk of 500 items reads at most
//! 500 × 2 × 50 values. A total kept in a field of its own would make the read O(1), but
//! it is a second write per key that must stay in step with the parts, and a script aborted
//! between the two (Redis does not roll scripts back) would leave them apart for the key's
//! life; the sum cannot drift. Memory: each replica writing an entity adds a field (16-byte
//! name and an integer, listpack-encoded up to 128 fields) to that key; an entity hit on one
//! replica costs about what a string would.
//!
//! Mixed versions. Replicas that add deltas (`HINCRBY` on their own field, raised to what
//! they acknowledged) and replicas that state their parts share these keys during a rolling
//! upgrade: each writes only its own fields, every version sums all of them, so the fleet
//! keeps one count; the older replicas keep their own double counting under timeouts until
//! they are replaced. So do the versions before refunds were kept out: they read the same
//! count (the `<id>+` fields are in the sum), and their own refunds are applied whole, as
//! they were, until they are replaced (`tests/redis/refund_store.rs`).
//!
//! Upgrading from key version 1 (plain strings at `{prefix}sluice:{<entity>}:…`) starts every
//! counter afresh once: a version-2 replica never reads or writes a version-1 key, so a
//! rolling upgrade cannot hit `WRONGTYPE`, and the old keys expire on their own.
//!
//! # Token buckets
//! A bucket (`SyncOp::Bucket`, `core/bucket/`) is a hash at
//! `{prefix}sluice:b1:{<entity>}:<limit>` with two fields: `t`, the fleet's theoretical
//! arrival time (Unix µs with three decimals, `W.NNN`: whole nanoseconds, as the exact rules'
//! buckets keep it, `gcra.lua`), and `n`,
//! the tokens spent so far (for measuring rates); and two per replica that spent in it, its
//! id and its id followed by `-`: the tokens it spent and gave back, as applied (each modulo
//! 2^32). A call states the replica's totals of both; the script applies only what they add
//! to what it holds, so a call that timed out but ran, then sent again, spends nothing twice
//! (replicas of an older version, which send deltas alone, write neither field and are
//! applied as before). A second script, `BUCKET_SCRIPT`, spends a
//! replica's tokens since it last saw the bucket full from the time the first of them was
//! spent (`t = max(t, since) + spend × T`, at most one capacity below empty; a refund never
//! takes it below now), adds all its tokens to `n`, and
//! keeps the key until the bucket is full again plus a minute. A bucket the script does not
//! find is read as the `t` the replica last saw (`floor`): after Redis restarts empty, the
//! fleet's buckets come back as empty as the replicas last knew them rather than full. Its
//! calls go in the same pipeline as the windows' (`batches`), and `tests/redis/redis_store.rs`
//! checks both scripts against the in-memory store the simulator runs on.
//!
//! Versions before the shared encoding wrote `t` as a double of Unix µs (`%.17g`: `W` or
//! `W.D`) and spent in doubles of µs. Both read the other's `t` (the old with `tonumber`, the
//! new as `W`, `W.D` or `W.NNN`) and differ by less than a microsecond, so replicas of both
//! spend one bucket during a rolling upgrade, with no key version bump
//! (`tests/redis/tat_upgrade.rs`).
//!
//! The RLQS streams per counter that replicas publish (`ShardStore::round_trip`'s `Publish`) have keys and
//! a script of their own: `presence.rs`.
//!
//! Each tick also runs a separate script in the same pipeline: the replica's heartbeat, which
//! counts the live replicas and reads the store's generation (`heartbeat.rs`).
//!
//! An operator's reset (`POST /reset`) adds a field `reset-` to a counter, minus its sum:
//! read by this script as refunds the store applied (its name ends in `-`), so neither a
//! replica's statement nor its floor brings the count back (`reset.rs`, `reset.lua`).
//!
//! Credentials never leave this module: shard names are the URLs without them.

use deadpool_redis::redis::{self, Value};

use super::conn::{RedisOptions, SentinelMaster};
use super::error::backend;
use super::heartbeat::Heartbeats;
use super::keys::{bucket_key_of, field, window_key};
use super::pool::{OpenError, RedisPool, Shard};
use super::script::{self, Call, Lua};

use crate::global::sync::store::{beat_in_one, Answer, Trip};
use crate::global::{Beat, Heartbeat, Others, Presence, ShardStore, StoreError, SyncItem, SyncOp};

/// States parts and reads counters (see the module docs). KEYS: two per item (current,
/// previous epoch). ARGV: the replica's field, then seven per item (ttl ms, current hits,
/// previous hits, current refunds, previous refunds, current floor, previous floor). Returns
/// one integer per key: the sum, at least the floor less the key's applied refunds.
const SYNC_SCRIPT: &str = include_str!("sync.lua");

/// Spends tokens of buckets and reads them (`SyncOp::Bucket`). KEYS: one hash per bucket
/// (`t`: the `tat`, `W.NNN` Unix µs, `n`: tokens spent, and per replica, under its id and its
/// id followed by `-`, the tokens it spent and gave back as applied, modulo 2^32). ARGV: the
/// replica's field, then ten per item (delta, now µs, since µs, interval ns, max ahead ns,
/// floor µs, ttl ms, spend, tokens spent so far, tokens given back so far). In place of the
/// delta, what the statement adds to what was applied (`memory::fresh`: a call that timed
/// out but ran, sent again, spends nothing twice), and the spend corrected by as much
/// (`memory::run_of`). Returns two integers per key: `tat`, `n`. A bucket that is full and
/// was never spent is not written. Its arithmetic and `tat` encoding are `gcra.lua`'s, which
/// comes first.
const BUCKET_SCRIPT: &str = concat!(include_str!("gcra.lua"), include_str!("bucket.lua"));

/// Items per script call: bounds the script's run time on the Redis thread.
const CHUNK: usize = 500;

/// The key of a window item's counter of `epoch`: version 2, a hash.
fn key(prefix: &str, it: &SyncItem, epoch: u64) -> String {
    window_key(prefix, it.entity, it.limit, epoch)
}

/// The key of a bucket item: a hash of `tat` and tokens spent.
fn bucket_key(prefix: &str, it: &SyncItem) -> String {
    bucket_key_of(prefix, it.entity, it.limit)
}

/// Which script an item goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Window,
    Bucket,
}

impl Kind {
    fn of(it: &SyncItem) -> Kind {
        match it.op {
            SyncOp::Window { .. } => Kind::Window,
            SyncOp::Bucket { .. } => Kind::Bucket,
        }
    }
}

/// The script calls of a batch: windows, then buckets, each in chunks of [`CHUNK`], with
/// the indices of the items each covers.
fn batches(items: &[SyncItem]) -> Vec<(Kind, Vec<usize>)> {
    let mut out = Vec::new();
    for kind in [Kind::Window, Kind::Bucket] {
        let of: Vec<usize> = (0..items.len())
            .filter(|&i| Kind::of(&items[i]) == kind)
            .collect();
        out.extend(of.chunks(CHUNK).map(|c| (kind, c.to_vec())));
    }
    out
}

/// The keys and arguments of the `kind` script's call over `items`.
fn item_args(cmd: &mut redis::Cmd, kind: Kind, replica: u64, items: &[&SyncItem], prefix: &str) {
    match kind {
        Kind::Window => {
            cmd.arg(items.len() * 2);
            for it in items {
                if let SyncOp::Window { epochs, .. } = it.op {
                    cmd.arg(key(prefix, it, epochs[0]))
                        .arg(key(prefix, it, epochs[1]));
                }
            }
            cmd.arg(field(replica));
            for it in items {
                if let SyncOp::Window {
                    parts,
                    ttl_ms,
                    floors,
                    ..
                } = it.op
                {
                    cmd.arg(ttl_ms)
                        .arg(parts[0].hits)
                        .arg(parts[1].hits)
                        .arg(parts[0].refunds)
                        .arg(parts[1].refunds)
                        .arg(floors[0])
                        .arg(floors[1]);
                }
            }
        }
        Kind::Bucket => {
            cmd.arg(items.len());
            for it in items {
                cmd.arg(bucket_key(prefix, it));
            }
            cmd.arg(field(replica));
            for it in items {
                if let SyncOp::Bucket {
                    delta,
                    spend,
                    now_us,
                    since_us,
                    interval_ns,
                    max_ahead_ns,
                    floor_us,
                    ttl_ms,
                    stated,
                } = it.op
                {
                    cmd.arg(delta)
                        .arg(now_us)
                        .arg(since_us)
                        .arg(interval_ns)
                        .arg(max_ahead_ns)
                        .arg(floor_us)
                        .arg(ttl_ms)
                        .arg(spend)
                        .arg(stated[0])
                        .arg(stated[1]);
                }
            }
        }
    }
}

fn totals(v: &Value, n: usize) -> Result<Vec<[u64; 2]>, StoreError> {
    let Value::Array(vals) = v else {
        return Err(backend(format!("unexpected script reply {v:?}")));
    };
    if vals.len() != n * 2 {
        return Err(backend(format!(
            "script returned {} values for {} keys",
            vals.len(),
            n * 2
        )));
    }
    let num = |v: &Value| match v {
        Value::Int(i) => (*i).max(0) as u64,
        _ => 0,
    };
    Ok(vals.chunks(2).map(|c| [num(&c[0]), num(&c[1])]).collect())
}

async fn time_of<C: redis::aio::ConnectionLike>(conn: &mut C) -> Result<u64, StoreError> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .map_err(backend)?;
    Ok(secs * 1000 + micros / 1000)
}

/// A shard of global mode on Redis: a standalone server, the master of a Sentinel deployment,
/// or a Redis Cluster holding every entity ([`RedisPool`]). A standalone shard makes one
/// pipeline a call (a script call per chunk, `batches`); on a cluster, whose script calls'
/// keys must share a slot, the client routes each entity's call to the master of its slot,
/// all calls of a tick in flight at once.
pub struct RedisStore {
    name: String,
    pool: RedisPool,
    prefix: String,
    window: Lua,
    bucket: Lua,
    beats: Heartbeats,
    presence: Lua,
}

impl RedisStore {
    /// The stores of one Redis setting: its shards (a standalone server each), its master
    /// found through sentinels, or its cluster. Connections are made lazily, so a Redis that
    /// is down at start only makes its shard degraded.
    ///
    /// # Errors
    /// When a URL is unusable.
    pub fn all(
        urls: &[String],
        cluster: bool,
        sentinel: Option<&SentinelMaster>,
        opts: &RedisOptions,
    ) -> Result<Vec<RedisStore>, OpenError> {
        Ok(RedisPool::open(urls, cluster, sentinel, opts)?
            .into_iter()
            .map(|s| Self::on(s, opts))
            .collect())
    }

    /// A shard at `url` (normalized by [`super::normalize_url`]).
    ///
    /// # Errors
    /// When the URL is unusable.
    pub fn new(url: &str, opts: &RedisOptions) -> Result<Self, OpenError> {
        let one = Self::all(std::slice::from_ref(&url.to_string()), false, None, opts)?;
        Ok(one.into_iter().next().expect("one URL, one shard"))
    }

    /// A cluster reached through `seeds` (normalized URLs).
    ///
    /// # Errors
    /// When the URLs are unusable.
    pub fn cluster(seeds: &[String], opts: &RedisOptions) -> Result<Self, OpenError> {
        let one = Self::all(seeds, true, None, opts)?;
        Ok(one.into_iter().next().expect("a cluster is one shard"))
    }

    fn on(shard: Shard, opts: &RedisOptions) -> Self {
        RedisStore {
            beats: Heartbeats::new(&opts.prefix, &shard.name),
            name: shard.name,
            pool: shard.pool,
            prefix: opts.prefix.clone(),
            window: Lua::new(SYNC_SCRIPT),
            bucket: Lua::new(BUCKET_SCRIPT),
            presence: Lua::new(super::presence::PRESENCE_SCRIPT),
        }
    }

    fn lua(&self, kind: Kind) -> &Lua {
        match kind {
            Kind::Window => &self.window,
            Kind::Bucket => &self.bucket,
        }
    }

    /// The script call of `kind` over `items[i]` for each `i` of `of`.
    fn call<'a>(
        &'a self,
        kind: Kind,
        replica: u64,
        items: &'a [SyncItem],
        of: &'a [usize],
    ) -> Call<'a> {
        Call::new(self.lua(kind), move |cmd| {
            let its: Vec<&SyncItem> = of.iter().map(|&i| &items[i]).collect();
            item_args(cmd, kind, replica, &its, &self.prefix);
        })
    }

    /// A standalone shard's call: one pipeline, a script call per chunk of items
    /// (`batches`), then the heartbeat (when given). Errors are read per reply: a heartbeat
    /// that fails must not make the chunks, which were applied, be sent again.
    async fn pipeline(
        &self,
        replica: u64,
        items: &[SyncItem],
        beat: Option<&Heartbeat>,
    ) -> Result<(Vec<[u64; 2]>, Option<Beat>), StoreError> {
        let mut conn = self.pool.get().await.map_err(backend)?;
        let batches = batches(items);
        let mut calls: Vec<Call<'_>> = batches
            .iter()
            .map(|(kind, of)| self.call(*kind, replica, items, of))
            .collect();
        if let Some(b) = beat {
            calls.push(self.beats.call(b, true));
        }
        let replies = script::pipeline(&mut conn, &calls).await.map_err(backend)?;
        let live = match beat
            .and(replies.get(batches.len()))
            .map(|v| self.beats.reply(v))
        {
            None => None,
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                if items.is_empty() {
                    return Err(e);
                }
                tracing::warn!(shard = %self.name, error = %e, "heartbeat failed");
                None
            }
        };
        let mut out = vec![[0; 2]; items.len()];
        for (reply, (_, of)) in replies.iter().zip(&batches) {
            for (i, t) in of.iter().zip(totals(reply, of.len())?) {
                out[*i] = t;
            }
        }
        Ok((out, live))
    }

    /// A cluster's sync: one call per entity limit (a script's keys must share a slot), all
    /// in flight at once.
    async fn cluster_sync(
        &self,
        replica: u64,
        items: &[SyncItem],
    ) -> Result<Vec<[u64; 2]>, StoreError> {
        let conn = self.pool.get().await.map_err(backend)?;
        let handle = conn
            .cluster_handle()
            .ok_or_else(|| backend("not a cluster connection"))?;
        let idx: Vec<usize> = (0..items.len()).collect();
        let calls = idx.iter().map(|&i| {
            let mut c = handle.clone();
            let call = self.call(Kind::of(&items[i]), replica, items, &idx[i..=i]);
            async move {
                let v = call.run(&mut c).await.map_err(backend)?;
                totals(&v, 1).map(|t| t[0])
            }
        });
        futures_util::future::try_join_all(calls).await
    }
}

impl RedisStore {
    /// The sync's part of a trip alone (`ShardStore::round_trip`).
    pub async fn sync(
        &self,
        replica: u64,
        items: &[SyncItem],
    ) -> Result<Vec<[u64; 2]>, StoreError> {
        if self.pool.is_cluster() {
            return self.cluster_sync(replica, items).await;
        }
        Ok(self.pipeline(replica, items, None).await?.0)
    }

    /// The heartbeat's part of a trip alone.
    pub async fn heartbeat(&self, beat: &Heartbeat) -> Result<Beat, StoreError> {
        if self.pool.is_cluster() {
            return self.beats.on_cluster(&self.pool, beat).await;
        }
        self.pipeline(beat.replica, &[], Some(beat))
            .await?
            .1
            .ok_or_else(|| backend("heartbeat failed"))
    }

    /// The sync's and the heartbeat's parts of a trip, in one round trip.
    pub async fn sync_and_beat(
        &self,
        replica: u64,
        items: &[SyncItem],
        beat: &Heartbeat,
    ) -> Result<(Vec<[u64; 2]>, Option<Beat>), StoreError> {
        if !self.pool.is_cluster() {
            return self.pipeline(replica, items, Some(beat)).await;
        }
        if items.is_empty() {
            return Ok((
                Vec::new(),
                Some(self.beats.on_cluster(&self.pool, beat).await?),
            ));
        }
        // The item calls and the heartbeat in flight at once: one round trip. A failed
        // heartbeat leaves the sync's result alone (its parts were stated).
        let (totals, live) = futures_util::future::join(
            self.cluster_sync(replica, items),
            self.beats.on_cluster(&self.pool, beat),
        )
        .await;
        if let Err(e) = &live {
            tracing::warn!(shard = %self.name, error = %e, "heartbeat failed");
        }
        Ok((totals?, live.ok()))
    }

    /// `presence.lua` (`presence.rs`, its data model).
    pub async fn presence(
        &self,
        replica: u64,
        items: &[Presence],
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Vec<Others>, StoreError> {
        let (pool, lua, prefix) = (&self.pool, &self.presence, self.prefix.as_str());
        super::presence::publish(pool, lua, prefix, replica, items, now_ms, ttl_ms).await
    }
}

impl ShardStore for RedisStore {
    fn name(&self) -> &str {
        &self.name
    }

    /// The sync and the heartbeat in one pipeline (on a cluster: at once); the streams are
    /// a call of their own (`presence.rs`), as the presence loop sends them alone.
    async fn round_trip(&self, replica: u64, trip: Trip<'_>) -> Result<Answer, StoreError> {
        beat_in_one(
            trip,
            |items| self.sync(replica, items),
            |items, beat| self.sync_and_beat(replica, items, beat),
            |p| self.presence(replica, p.items, p.now_ms, p.ttl_ms),
        )
        .await
    }

    async fn time_ms(&self) -> Result<u64, StoreError> {
        let mut conn = self.pool.get().await.map_err(backend)?;
        time_of(&mut conn).await
    }

    /// `replicas.rs`.
    async fn replicas(&self) -> Result<Vec<(u64, u64)>, StoreError> {
        super::replicas::read(&self.pool, &self.prefix).await
    }

    fn commands_for(&self, items: usize) -> usize {
        if self.pool.is_cluster() {
            items
        } else {
            items.div_ceil(CHUNK)
        }
    }

    /// On a cluster the generation is a call of its own (`heartbeat.rs`).
    fn commands_for_beat(&self) -> usize {
        1 + usize::from(self.pool.is_cluster())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window_item(entity: u128, limit: u8, epochs: [u64; 2]) -> SyncItem {
        SyncItem {
            entity,
            limit,
            op: SyncOp::Window {
                epochs,
                parts: Default::default(),
                floors: [0, 0],
                ttl_ms: 1,
            },
        }
    }

    #[test]
    fn the_redis_key_of_a_known_rule_is_pinned() {
        // The contract between versions (rules/identity.rs): a rolling upgrade must not move
        // counters. The expected key was computed from the documented encoding with Python's
        // `xxhash`, independently of this code. Changed once, on purpose, for key version 2
        // (a hash per counter, one field per replica): a version-1 string at the old key must
        // never meet a hash command, so upgrading from version 1 starts counters afresh.
        let rules = crate::rules::compile_sources(
            &[(
                "edge.yaml".into(),
                "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: day, requests_per_unit: 3, algorithm: fixed_window}\n".into(),
            )],
            false,
        )
        .unwrap();
        let m = rules
            .find("edge", &[("remote_address", "10.0.0.1")])
            .unwrap();
        let item = window_item(m.entity, 0, [20_000, 19_999]);
        assert_eq!(
            key("tenant-a:", &item, 20_000),
            "tenant-a:sluice:v2:{11a4ed83fdcfa3756cf3fa4df5896fd2}:0:20000"
        );
        assert_eq!(field(0xab), "00000000000000ab");
    }

    #[test]
    fn keys_keep_an_entity_in_one_slot() {
        let it = window_item(0xab, 1, [10, 9]);
        assert_eq!(
            key("p:", &it, 10),
            "p:sluice:v2:{000000000000000000000000000000ab}:1:10"
        );
        assert_eq!(
            key("p:", &it, 9),
            "p:sluice:v2:{000000000000000000000000000000ab}:1:9"
        );
    }
}
