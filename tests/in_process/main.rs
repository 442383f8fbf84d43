//! Integration tests that need no external service: the server in this process on loopback
//! (a manual clock), the decision core, the reference's cases, the simulator, the fuzz targets.
//! One crate, so the library is linked once for all of them (docs/development.md, "Tests").

#[path = "../common/mod.rs"]
mod common;

mod accounting;
mod dynamic_metadata;
mod entity_table;
mod fuzz_regressions;
mod grpc;
mod http_limits;
mod limiter_props;
mod prometheus_ref;
mod reference;
mod reload;
mod shutdown;
mod simulate;
mod statsd;
mod tls;
mod xds;
