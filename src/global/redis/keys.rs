//! The names of the keys sluice keeps in Redis, and a replica's field in them: the sync's
//! counters and buckets (`sync.rs`), the exact rules' (`exact.rs`), the RLQS streams'
//! fields (`presence.rs`); `reset.rs` names the same keys. Apart from each, so they share the
//! names without naming each other. An entity's keys all hash to one Cluster slot (its
//! `{entity}` tag).

/// The key of the counter of (`entity`, `limit`, `epoch`).
pub(crate) fn window_key(prefix: &str, entity: u128, limit: u8, epoch: u64) -> String {
    format!("{prefix}sluice:v2:{{{entity:032x}}}:{limit}:{epoch}")
}

/// The key of the bucket of (`entity`, `limit`).
pub(crate) fn bucket_key_of(prefix: &str, entity: u128, limit: u8) -> String {
    format!("{prefix}sluice:b1:{{{entity:032x}}}:{limit}")
}

/// A replica's field in every counter.
pub(crate) fn field(replica: u64) -> String {
    format!("{replica:016x}")
}

/// The Redis key of an exact counter.
pub fn exact_key(prefix: &str, entity: u128, limit: u8, epoch: u64) -> String {
    format!("{prefix}sluice:x:{{{entity:032x}}}:{limit}:{epoch}")
}

/// The Redis key of an exact token bucket: its `tat` (see `exact.rs`'s `EXACT_SCRIPT`). No epoch: a
/// bucket is one value for good, gone when full.
pub fn exact_bucket_key(prefix: &str, entity: u128, limit: u8) -> String {
    format!("{prefix}sluice:xb:{{{entity:032x}}}:{limit}")
}
