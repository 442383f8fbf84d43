//! Integration tests of the `sluice` binary as a child process, end to end: its subcommands
//! and signals, a real Envoy in front of it, OTLP export, and the vendored protos checked with
//! protoc. One crate, so the library is linked once for all of them.

/// The helpers in tests/common/ this crate uses: each crate names the files it compiles, so
/// a file comes in only where it is used. The few items two crates share and the third does
/// not carry their own `allow(dead_code)`, saying which.
#[path = "../common"]
mod common {
    mod helpers;
    pub use helpers::*;
    pub mod certs;
}

mod envoy_e2e;
mod otlp;
mod process;
mod proto_vendor;
