//! The command line (`args.rs`: the top-level command and the client subcommands' flags) and
//! the clients: `sluice check` (validate rules), `sluice query` (one request), `sluice
//! explain` (`explain.rs`: what a request would be answered, and why), `sluice reset` (clear
//! counters, `reset.rs`), both calling the admin port through `admin.rs`, and `sluice load`
//! (a load generator with latency percentiles; `--rlqs`: a fleet of quota-service streams).

pub mod admin;
mod args;
mod explain;
#[cfg(feature = "tools")]
pub mod load;
#[cfg(feature = "tools")]
pub mod load_rlqs;
mod reset;

#[cfg(feature = "tools")]
pub use load::load;

use std::process::ExitCode;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::{Channel, Endpoint};

pub use args::{CheckArgs, Cli, Command, ExplainArgs, LoadArgs, QueryArgs, ResetArgs};
pub use explain::{explain, render as render_explanation, ExplainError};
pub use reset::reset;

/// Why `sluice query` could not send its request.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A descriptor entry without `=`.
    #[error("'{0}' is not key=value")]
    NotKeyValue(String),
    /// `--addr` is not a URI.
    #[error("bad address '{addr}': {source}")]
    BadAddress {
        /// The address given.
        addr: String,
        /// Why it is not one.
        source: tonic::transport::Error,
    },
    /// Nothing listens at the address: the usual cause, a server not started yet, named
    /// with what to do about it (tonic's own text is only "transport error").
    #[error(
        "no server is listening at {addr} ({causes}). Is `sluice serve` running? \
         Start it, or name its gRPC address with --addr"
    )]
    Refused {
        /// The address given.
        addr: String,
        /// The chain of causes, joined by `: `.
        causes: String,
    },
    /// Any other connection failure.
    #[error("cannot connect to {addr}: {causes}")]
    Connect {
        /// The address given.
        addr: String,
        /// The chain of causes, joined by `: `.
        causes: String,
    },
}

/// `sluice check`: validates every file (directories are expanded) and lists every error, or
/// every warning of files that are valid (they pass: the reference loads them).
pub fn check(args: &CheckArgs) -> ExitCode {
    let mut files = Vec::new();
    for p in &args.paths {
        match crate::sources::files::rule_files(p) {
            Ok(mut f) => files.append(&mut f),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let options = crate::rules::CompileOptions {
        merge_domains: args.merge_domain_config,
        ..Default::default()
    };
    match crate::sources::files::load_files(&files, options) {
        Ok(set) => {
            for w in set.warnings() {
                println!("warning: {w}");
            }
            println!(
                "OK: {} rule(s) in {} file(s)",
                set.rules().len(),
                files.len()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors {
                println!("{e}");
            }
            eprintln!("{} error(s)", errors.len());
            ExitCode::FAILURE
        }
    }
}

/// Parses `key=value[,key2=value2...]` into descriptor entries.
///
/// # Errors
/// When an entry has no `=`.
pub fn parse_descriptor(s: &str) -> Result<RateLimitDescriptor, QueryError> {
    let entries = s
        .split(',')
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .ok_or_else(|| QueryError::NotKeyValue(kv.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

async fn connect(addr: &str) -> Result<Channel, QueryError> {
    Endpoint::from_shared(addr.to_string())
        .map_err(|source| QueryError::BadAddress {
            addr: addr.to_string(),
            source,
        })?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| connect_error(addr, &e))
}

/// Says what a failed connection means. Tonic's own text is only "transport error", and the
/// usual cause, a server not started yet, deserves to be named with what to do about it.
fn connect_error(addr: &str, e: &(dyn std::error::Error + 'static)) -> QueryError {
    let mut causes = Vec::new();
    let mut refused = false;
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        causes.push(err.to_string());
        next = err.source();
    }
    causes.dedup();
    let (addr, causes) = (addr.to_string(), causes.join(": "));
    if refused {
        QueryError::Refused { addr, causes }
    } else {
        QueryError::Connect { addr, causes }
    }
}

/// `sluice query`: sends one request and prints the response as proto3 JSON.
pub async fn query(args: QueryArgs) -> ExitCode {
    // `--hits` is each descriptor's own hits_addend (0 included: a check that counts
    // nothing, as Envoy's token-budget check sends it).
    let hits = args.hits.map(|value| UInt64Value { value });
    let descriptors = match args
        .descriptors
        .iter()
        .map(|d| {
            parse_descriptor(d).map(|d| RateLimitDescriptor {
                hits_addend: hits,
                ..d
            })
        })
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sluice query: {e}");
            return ExitCode::from(64);
        }
    };
    let channel = match connect(&args.addr).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice query: {e}");
            return ExitCode::FAILURE;
        }
    };
    let req = RateLimitRequest {
        domain: args.domain,
        descriptors,
        hits_addend: args.hits_addend,
    };
    match RateLimitServiceClient::new(channel)
        .should_rate_limit(req)
        .await
    {
        Ok(resp) => {
            let json = crate::server::json::response_json(resp.get_ref());
            println!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Err(status) => {
            eprintln!("sluice query: {:?}: {}", status.code(), status.message());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_descriptors() {
        let d = parse_descriptor("a=1,b=x=y").unwrap();
        assert_eq!(d.entries.len(), 2);
        assert_eq!(
            (d.entries[1].key.as_str(), d.entries[1].value.as_str()),
            ("b", "x=y")
        );
        assert_eq!(
            parse_descriptor("novalue").unwrap_err().to_string(),
            "'novalue' is not key=value"
        );
    }

    #[test]
    fn a_refused_connection_names_the_likely_cause() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            connect_error("http://127.0.0.1:1", &refused).to_string(),
            "no server is listening at http://127.0.0.1:1 (connection refused). Is `sluice \
             serve` running? Start it, or name its gRPC address with --addr"
        );
        let other = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(
            connect_error("http://h:1", &other).to_string(),
            "cannot connect to http://h:1: timed out"
        );
    }
}
