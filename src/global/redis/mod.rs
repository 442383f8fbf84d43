//! Redis for global mode: connections (URLs, auth, TLS, pools, Sentinel, Cluster) in
//! `conn.rs`, and the sync's store (its data model and scripts) in `sync.rs`. The exact rules'
//! store is in `global/exact/redis.rs`, on pools of its own made here.

pub mod conn;
pub mod sync;

pub use conn::{init_tls, normalize_url, redact, RedisOptions, RedisTls, SentinelMaster};
pub use sync::{RedisClusterStore, RedisShard, RedisStore};
