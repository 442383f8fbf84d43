//! The I/O edges a client sees: the gRPC service, the HTTP admin port, rules reload from disk,
//! rules from an xDS management server, and shutdown (signals, readiness). Each translates to
//! and from the `rls` semantics; none decides anything itself.

pub mod grpc;
pub mod grpc_conn;
pub mod http;
pub mod http_conn;
pub mod json;
pub mod nofile;
pub mod prometheus_ref;
pub mod reload;
pub mod shutdown;
pub mod statsd;
pub mod tls;
pub mod xds;
