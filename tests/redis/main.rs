//! Integration tests against real redis-server processes started by the harness
//! (`tests/common/redis/`): global mode, exact rules, buckets shared through Redis, Sentinel,
//! Cluster, the RLQS presence store, the image swap for envoyproxy/ratelimit (its binary on Redis and xDS), and the
//! harness itself. One crate, so the library is linked once for all of them.

/// The helpers in tests/common/ this crate uses: each crate names the files it compiles, so
/// a file comes in only where it is used. The few items two crates share and the third does
/// not carry their own `allow(dead_code)`, saying which.
#[path = "../common"]
mod common {
    mod helpers;
    pub use helpers::*;
    pub mod certs;
    pub mod procs;
    pub mod redis;
    pub mod rlqs;
    mod server;
    pub use server::Server;
    pub mod tls_client;
    pub mod xds;
}

mod buckets;
mod dashboard;
mod drop_in;
mod exact;
mod exact_store;
mod explain;
mod global;
mod presence_store;
mod redis_deployments;
mod redis_harness;
mod redis_store;
mod refund_store;
mod reset_log_store;
mod reset_store;
mod status;
mod tat_upgrade;
