//! All of global mode's Redis code, scripts included (the feature folders `sync/`, `exact/`,
//! `presence/` hold none; the in-memory twin is `global/memory/`): connection settings (URLs,
//! auth, TLS, Sentinel, Cluster clients) in `conn.rs`, the one pool type over standalone,
//! Sentinel and Cluster in `pool.rs`, scripts and their `NOSCRIPT` fallback in `script.rs`,
//! Redis's errors classified in `error.rs`, the keys' names in `keys.rs`, the sync's store
//! (its data model and scripts) in `sync.rs`, the exact rules' store in `exact.rs`
//! (`exact.lua`, on pools of its own), the heartbeats and the store's generation they read in
//! `heartbeat.rs`, the set of replicas as a joining replica reads it in `replicas.rs`, and
//! the RLQS streams each replica publishes per counter in `presence.rs`, an operator's reset
//! of an entity's counters in `reset.rs`, and the reset log that tells the other replicas of
//! it in `reset_log.rs`.

pub mod conn;
pub(crate) mod error;
pub mod exact;
mod heartbeat;
mod keys;
pub(crate) mod pool;
mod presence;
mod replicas;
pub(crate) mod reset;
mod reset_log;
pub(crate) mod script;
pub mod sync;

pub use conn::{init_tls, normalize_url, redact, RedisOptions, RedisTls, SentinelMaster, UrlError};
pub use pool::OpenError;
pub use sync::RedisStore;
