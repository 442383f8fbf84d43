//! The `sluice` binary: parse the command line, set up logging, run the subcommand, map
//! failures to exit codes (64 usage, 78 configuration, 1 other). The only place that reads
//! the process environment: it is handed to `Settings::resolve` as a map.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use sluice::cli::{Cli, Command};
use sluice::settings::Settings;

const EX_USAGE: u8 = 64;
const EX_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(arguments()) {
        Ok(cli) => cli,
        // `--help` and `--version` print and succeed; a malformed command line is a usage
        // error like a bad setting, so it exits 64 too (clap's own code would be 2).
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(EX_USAGE);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve(args) => {
            let settings = match Settings::resolve(&args, &environment()) {
                Ok(s) => s,
                Err(errors) => {
                    for e in errors {
                        eprintln!("sluice: {e}");
                    }
                    return ExitCode::from(EX_USAGE);
                }
            };
            sluice::telemetry::init_logging(&settings.log_level, &settings.log_format);
            for w in &settings.warnings {
                tracing::warn!("{w}");
            }
            runtime.block_on(serve(settings))
        }
        Command::Check(args) => sluice::cli::check(&args),
        Command::Query(args) => runtime.block_on(sluice::cli::query(args)),
        Command::Explain(args) => runtime.block_on(sluice::cli::explain(args)),
        Command::Reset(args) => runtime.block_on(sluice::cli::reset(&args)),
        #[cfg(feature = "tools")]
        Command::Load(args) => runtime.block_on(sluice::cli::load(args)),
        #[cfg(feature = "tools")]
        Command::Simulate(args) => {
            if args.rlqs {
                print!("{}", sluice::sim::run_rlqs());
            } else {
                print!("{}", sluice::sim::run_all());
            }
            ExitCode::SUCCESS
        }
    }
}

/// The command line, with `serve` put in when the binary runs as `ratelimit` without a
/// subcommand: envoyproxy/ratelimit's image is started as `/bin/ratelimit` with no arguments
/// (Envoy Gateway's and Istio's manifests say so), and sluice's image has that name too.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let as_ratelimit = args.first().is_some_and(|a| {
        std::path::Path::new(a)
            .file_name()
            .is_some_and(|n| n == "ratelimit")
    });
    let no_subcommand = args
        .get(1)
        .is_none_or(|a| a.to_string_lossy().starts_with('-'));
    if as_ratelimit && no_subcommand {
        args.insert(1, "serve".into());
    }
    args
}

/// The process environment. A value that is not UTF-8 is passed on lossily, so that it fails
/// its setting's check (or shows) rather than vanishing as if unset.
fn environment() -> HashMap<String, String> {
    std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

async fn serve(settings: Settings) -> ExitCode {
    sluice::server::nofile::raise_open_files_limit();
    let result = async {
        let listeners = sluice::Listeners::bind(&settings).await?;
        let clock = Arc::new(sluice::core::clock::SystemClock::skewed(
            settings.clock_skew_ms,
        ));
        sluice::run(
            settings,
            listeners,
            clock,
            sluice::server::shutdown::signal(),
        )
        .await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ sluice::RunError::Rules(_)) => {
            tracing::error!("{e}");
            eprintln!("sluice: {e}");
            ExitCode::from(EX_CONFIG)
        }
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}
