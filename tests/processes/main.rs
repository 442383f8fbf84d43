//! Integration tests of the `sluice` binary as a child process, end to end: its subcommands
//! and signals, a real Envoy in front of it (the rate-limit filter, and the quota filter on a
//! fleet of replicas on Redis), OTLP export, the status page in headless Chromium, and the
//! vendored protos checked with protoc. One crate, so the library is linked once for all of them.

/// The helpers in tests/common/ this crate uses: each crate names the files it compiles, so
/// a file comes in only where it is used. The few items two crates share and the third does
/// not carry their own `allow(dead_code)`, saying which.
#[path = "../common"]
mod common {
    mod helpers;
    pub use helpers::*;
    pub mod certs;
    /// `rlqs_e2e` runs sluice replicas in global mode: it uses their spawning and
    /// heartbeats, not `query` (the redis crate's domain `g`).
    #[allow(dead_code)]
    pub mod procs;
    /// `rlqs_e2e` needs one standalone Redis, not the harness's TLS, Sentinel or Cluster
    /// (nor the re-exports the redis crate uses).
    #[allow(dead_code, unused_imports)]
    pub mod redis;
}

mod cdp;
mod decision_log;
mod descriptors;
mod doc_blocks;
mod envoy_e2e;
mod explain;
mod llm_budget;
mod otlp;
mod process;
mod proto_vendor;
mod reading;
mod rlqs_e2e;
mod rule_log;
mod status_page;
mod top;
