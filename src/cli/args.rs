//! The command line: the top-level clap command (every subcommand) and the flags of the
//! client subcommands `check`, `query`, `explain` and `load`. `serve`'s flags are the service's settings
//! (`settings/flags.rs`, [`ServeArgs`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};

use super::admin::AdminRequestArgs;
use crate::settings::ServeArgs;

/// sluice: an external rate-limit service for Envoy and Istio.
#[derive(Debug, Parser)]
#[command(name = "sluice", version = crate::VERSION, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the rate-limit service.
    Serve(Box<ServeArgs>),
    /// Validate rules files; exit 1 listing every error.
    Check(CheckArgs),
    /// Send one ShouldRateLimit request and print the response.
    Query(QueryArgs),
    /// Ask the HTTP port what a request would be answered, and why (rule, file and line,
    /// counts), counting nothing.
    Explain(ExplainArgs),
    /// Clear descriptors' counters on every replica and in Redis (`POST /reset`, which
    /// needs the admin token) and print what was cleared.
    Reset(ResetArgs),
    /// Drive ShouldRateLimit and print throughput and latency percentiles (`--rlqs`: drive
    /// the quota service with a fleet of reporting streams).
    #[cfg(feature = "tools")]
    Load(LoadArgs),
    /// Run the fleet simulator (global mode vs. the plain design) and print its table.
    #[cfg(feature = "tools")]
    Simulate(SimulateArgs),
}

/// Flags of `sluice simulate`.
#[cfg(feature = "tools")]
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Run the quota service's (RLQS) scenarios instead: simulated Envoys' rate_limit_quota
    /// filters sharing one limit through sluice's quota streams.
    #[arg(long)]
    pub rlqs: bool,
}

// The client subcommands below keep clap's `env` (read once, by `Cli::parse` in main.rs) with
// `hide_env_values`, so their `--help` shows no environment value either.

/// Flags of `sluice check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Rules files or directories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Merge files that share a domain.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", hide_env_values = true, value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub merge_domain_config: bool,
}

/// Flags of `sluice query`.
#[derive(Debug, Clone, Args)]
pub struct QueryArgs {
    /// The service's gRPC address.
    #[arg(
        long,
        env = "SLUICE_ADDR",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8081"
    )]
    pub addr: String,
    /// The domain.
    #[arg(long)]
    pub domain: String,
    /// Descriptors, each `key=value[,key2=value2...]`.
    #[arg(required = true)]
    pub descriptors: Vec<String>,
    /// Request-level hits_addend (0 means 1, as Envoy sends it).
    #[arg(long, default_value_t = 0)]
    pub hits_addend: u32,
    /// Each descriptor's own hits_addend, which wins over the request's; 0 checks without
    /// counting (a token budget's check).
    #[arg(long, value_name = "N")]
    pub hits: Option<u64>,
}

/// Flags of `sluice explain`.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The admin port, the domain and the descriptors.
    #[command(flatten)]
    pub request: AdminRequestArgs,
    /// Request-level hits_addend (0 means 1, as Envoy sends it).
    #[arg(long, default_value_t = 0)]
    pub hits_addend: u32,
    /// Each descriptor's own hits_addend, which wins over the request's.
    #[arg(long, value_name = "N")]
    pub hits: Option<u64>,
    /// Print the answer as the server sent it (JSON).
    #[arg(long)]
    pub json: bool,
}

/// Flags of `sluice reset`.
#[derive(Debug, Clone, Args)]
pub struct ResetArgs {
    /// The admin port, the domain and the descriptors.
    #[command(flatten)]
    pub request: AdminRequestArgs,
    /// A file holding the admin token (the service's `ADMIN_TOKEN_FILE`).
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// The admin token itself (prefer `--token-file`: a flag shows in the process list).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Flags of `sluice load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// The service's gRPC address.
    #[arg(
        long,
        env = "SLUICE_ADDR",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8081"
    )]
    pub addr: String,
    /// The domain.
    #[arg(long, default_value = "load")]
    pub domain: String,
    /// The descriptor key; values are `v0`..`v{values-1}`.
    #[arg(long, default_value = "user")]
    pub key: String,
    /// Distinct descriptor values.
    #[arg(long, default_value_t = 10_000)]
    pub values: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// HTTP/2 connections shared by the workers.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Total requests per second (open loop); unset: as fast as responses come (closed loop).
    /// With `--rlqs`: the fleet's requests a second the reports stand for (required).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Drive the quota service (RLQS) instead: `--streams` Envoys, each reporting its
    /// `--buckets` buckets (`{key: v<i>}`, or `--bucket-id`) every `--report-interval`.
    #[arg(long)]
    pub rlqs: bool,
    /// With `--rlqs`: streams (Envoys), one connection each.
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// With `--rlqs`: buckets each stream reports.
    #[arg(long, default_value_t = 1000)]
    pub buckets: u64,
    /// With `--rlqs`: time between a stream's reports.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub report_interval: Duration,
    /// With `--rlqs`: each bucket's id, as `key=value,...`, where `{i}` is the bucket's number,
    /// `{s}` the stream's (so each stream's buckets are counters of their own) and `{x:N}` N
    /// times `x`; default `<key>=v{i}`.
    #[arg(long)]
    pub bucket_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_takes_the_settings_flags() {
        let Command::Serve(a) =
            Cli::try_parse_from(["sluice", "serve", "--grpc-port", "1", "--redis-auth", "x"])
                .unwrap()
                .command
        else {
            unreachable!("parsed serve")
        };
        assert_eq!(a.flag("GRPC_PORT"), Some("1"));
        assert_eq!(a.flag("REDIS_AUTH"), Some("x"));
        assert_eq!(a.flag("HTTP_PORT"), None);
    }

    #[test]
    fn help_shows_variables_and_defaults_but_no_values() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        let help = cmd
            .find_subcommand_mut("serve")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("[env: REDIS_AUTH]")
                && help.contains("[env: HTTP_MAX_CONNECTIONS] [default: 256]"),
            "{help}"
        );
        assert!(
            !help.contains("SLUICE_CLOCK_SKEW"),
            "the testing aid is hidden"
        );
    }
}
