//! Integration tests against real redis-server processes started by the harness
//! (`tests/common/redis.rs`): global mode, exact rules, buckets shared through Redis, Sentinel,
//! Cluster, and the harness itself. One crate, so the library is linked once for all of them.

#[path = "../common/mod.rs"]
mod common;

mod buckets;
mod dashboard;
mod exact;
mod global;
mod redis_deployments;
mod redis_harness;
mod redis_store;
