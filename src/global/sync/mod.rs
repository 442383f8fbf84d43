//! The background sync of global mode: the queues the hot path marks entities in, what the
//! heartbeats say of the fleet (`fleet.rs`, built by the wiring and handed down), one task
//! per shard that sends their hits and reads the fleet's counts, the narrow store interface
//! those calls go through (Redis in `global/redis/`, the in-memory store in `global/memory/`),
//! each shard's health and call size, its settings (`settings.rs`), the clock offset from
//! the store's time, and the reset log through which a replica learns of resets made
//! through others (`reset_log.rs`).

pub mod batch;
pub mod clock_offset;
pub mod fleet;
pub mod health;
mod in_flight;
mod plan;
pub mod queue;
pub mod reset_log;
mod reset_views;
pub mod settings;
pub mod shard;
#[cfg(test)]
mod shard_fleet_tests;
#[cfg(test)]
mod shard_reset_tests;
pub mod store;

pub use clock_offset::measure_offset;
pub use fleet::Fleet;
pub use health::ShardHealth;
pub use queue::{ShardRouter, SyncQueues, SyncStats};
pub use settings::SyncSettings;
pub use shard::ShardSync;
pub use store::{
    beat_in_one, in_steps, new_generation, new_replica_id, Answer, Beat, Heartbeat, Others,
    Presence, Publish, ResetNews, ResetRead, ShardStore, StoreError, StoreErrorKind, SyncItem,
    SyncOp, Trip,
};
