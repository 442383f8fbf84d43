//! Integration tests that need no external service: the server in this process on loopback
//! (a manual clock), the decision core, the reference's cases, the simulator, the fuzz targets.
//! One crate, so the library is linked once for all of them (docs/development.md, "Tests").

/// The helpers in tests/common/ this crate uses: each crate names the files it compiles, so
/// a file comes in only where it is used. The few items two crates share and the third does
/// not carry their own `allow(dead_code)`, saying which.
#[path = "../common"]
mod common {
    mod helpers;
    pub use helpers::*;
    pub mod certs;
    pub mod rlqs;
    mod server;
    pub use server::Server;
    pub mod tls_client;
    pub mod xds;
}

mod accounting;
mod doc_paths;
mod dynamic_metadata;
mod entity_table;
mod explain;
mod fuzz_regressions;
mod grpc;
mod headers;
mod http_endpoints;
mod http_limits;
mod layers;
mod limiter_props;
mod load_rlqs;
mod overrides;
mod prometheus_ref;
mod reference;
mod reflection;
mod reload;
mod reset;
mod rlqs;
mod shutdown;
mod simulate;
mod simulate_rlqs;
mod statsd;
mod status;
mod tls;
mod top;
mod xds;
