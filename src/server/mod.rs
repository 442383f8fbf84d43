//! The I/O edges a client sees: the gRPC service, the HTTP admin port, and shutdown
//! (signals, readiness). The rules' sources (files, xDS) are in `sources/`, the metrics'
//! exporters in `telemetry/`. Each translates to
//! and from the `rls` semantics; none decides anything itself.

pub mod admin_state;
pub mod admin_token;
pub mod grpc;
pub mod grpc_conn;
pub(crate) mod grpc_serve;
pub mod http;
pub mod http_conn;
pub mod json;
pub mod nofile;
pub mod page;
pub mod reset;
pub mod rlqs;
pub mod rls_codec;
mod rls_unary;
mod rls_write;
pub mod rule_sources;
pub mod shutdown;
pub mod status;
pub mod tls;
pub mod top;
