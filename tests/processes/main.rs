//! Integration tests of the `sluice` binary as a child process, end to end: its subcommands
//! and signals, a real Envoy in front of it, the image swap for envoyproxy/ratelimit, OTLP
//! export, and the vendored protos checked with protoc. One crate, so the library is linked
//! once for all of them.

#[path = "../common/mod.rs"]
mod common;

mod drop_in;
mod envoy_e2e;
mod otlp;
mod process;
mod proto_vendor;
