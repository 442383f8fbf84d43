//! The command-line clients: `sluice check` (validate rules), `sluice query` (one request) and
//! `sluice load` (a load generator with latency percentiles).

use std::process::ExitCode;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::settings::{CheckArgs, LoadArgs, QueryArgs};

/// `sluice check`: validates every file (directories are expanded) and lists every error.
pub fn check(args: &CheckArgs) -> ExitCode {
    let mut files = Vec::new();
    for p in &args.paths {
        match crate::server::reload::rule_files(p) {
            Ok(mut f) => files.append(&mut f),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    match crate::server::reload::load_files(&files, args.merge_domain_config) {
        Ok(set) => {
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
pub fn parse_descriptor(s: &str) -> Result<RateLimitDescriptor, String> {
    let entries = s
        .split(',')
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .ok_or_else(|| format!("'{kv}' is not key=value"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

async fn connect(addr: &str) -> Result<Channel, String> {
    Endpoint::from_shared(addr.to_string())
        .map_err(|e| format!("bad address '{addr}': {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// `sluice query`: sends one request and prints the response as proto3 JSON.
pub async fn query(args: QueryArgs) -> ExitCode {
    let descriptors = match args
        .descriptors
        .iter()
        .map(|d| parse_descriptor(d))
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

#[derive(Debug, Default)]
struct WorkerReport {
    latencies_us: Vec<u32>,
    ok: u64,
    over: u64,
    errors: u64,
}

/// `sluice load`: drives ShouldRateLimit and prints throughput and latency percentiles.
pub async fn load(args: LoadArgs) -> ExitCode {
    if args.concurrency == 0 || args.connections == 0 || args.values == 0 {
        eprintln!("sluice load: --concurrency, --connections and --values must be at least 1");
        return ExitCode::from(64);
    }
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        match connect(&args.addr).await {
            Ok(c) => channels.push(c),
            Err(e) => {
                eprintln!("sluice load: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let start = Instant::now();
    let deadline = start + args.duration;
    // Open loop: each worker sends on its own schedule and latency is measured from the
    // scheduled time, so a slow server cannot hide its queueing (coordinated omission).
    let per_worker_interval = args
        .rate
        .filter(|r| *r > 0)
        .map(|r| Duration::from_secs_f64(args.concurrency as f64 / r as f64));
    let mut tasks = Vec::new();
    for w in 0..args.concurrency {
        let mut client = RateLimitServiceClient::new(channels[w % channels.len()].clone());
        let (domain, key, values, concurrency) = (
            args.domain.clone(),
            args.key.clone(),
            args.values,
            args.concurrency as u64,
        );
        tasks.push(tokio::spawn(async move {
            let mut report = WorkerReport::default();
            let mut n = w as u64;
            let mut ticker = per_worker_interval.map(|i| {
                let mut t =
                    tokio::time::interval_at(start + i.mul_f64(w as f64 / concurrency as f64), i);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                t
            });
            loop {
                let sent_at = match &mut ticker {
                    Some(t) => t.tick().await,
                    None => Instant::now(),
                };
                if sent_at >= deadline {
                    break;
                }
                let req = RateLimitRequest {
                    domain: domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: key.clone(),
                            value: format!("v{}", n % values),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                n += concurrency;
                match client.should_rate_limit(req).await {
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => report.over += 1,
                    Ok(_) => report.ok += 1,
                    Err(_) => report.errors += 1,
                }
                let us = sent_at.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                report.latencies_us.push(us);
            }
            report
        }));
    }
    let mut all = WorkerReport::default();
    for t in tasks {
        if let Ok(mut r) = t.await {
            all.latencies_us.append(&mut r.latencies_us);
            all.ok += r.ok;
            all.over += r.over;
            all.errors += r.errors;
        }
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    all.latencies_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        if all.latencies_us.is_empty() {
            return 0.0;
        }
        let i =
            ((all.latencies_us.len() as f64 * p).ceil() as usize).clamp(1, all.latencies_us.len());
        f64::from(all.latencies_us[i - 1]) / 1000.0
    };
    let total = all.latencies_us.len();
    println!(
        "requests {total} in {elapsed:.2}s: {:.0} req/s (ok {}, over_limit {}, errors {})",
        total as f64 / elapsed,
        all.ok,
        all.over,
        all.errors
    );
    println!(
        "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(1.0)
    );
    if all.errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
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
        assert!(parse_descriptor("novalue").is_err());
    }
}
