//! `sluice load`: an open-loop load generator for ShouldRateLimit with latency percentiles
//! (`--rlqs` hands over to `load_rlqs.rs`).

use std::process::ExitCode;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::connect;
use crate::cli::LoadArgs;

#[derive(Debug, Default)]
struct WorkerReport {
    latencies_us: Vec<u32>,
    ok: u64,
    over: u64,
    errors: u64,
}

/// What one worker sends: its slice of the values, on its own schedule.
struct Worker {
    index: u64,
    concurrency: u64,
    domain: String,
    key: String,
    values: u64,
    /// Open loop: the worker's own send schedule (`None`: closed loop, as fast as answers).
    interval: Option<Duration>,
    start: Instant,
    deadline: Instant,
}

/// `sluice load`: drives ShouldRateLimit and prints throughput and latency percentiles.
pub async fn load(args: LoadArgs) -> ExitCode {
    if args.rlqs {
        return super::load_rlqs::load_rlqs(&args).await;
    }
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
    // Open loop: each worker sends on its own schedule and latency is measured from the
    // scheduled time, so a slow server cannot hide its queueing (coordinated omission).
    let interval = args
        .rate
        .filter(|r| *r > 0)
        .map(|r| Duration::from_secs_f64(args.concurrency as f64 / r as f64));
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|w| {
            let worker = Worker {
                index: w as u64,
                concurrency: args.concurrency as u64,
                domain: args.domain.clone(),
                key: args.key.clone(),
                values: args.values,
                interval,
                start,
                deadline: start + args.duration,
            };
            tokio::spawn(worker.run(channels[w % channels.len()].clone()))
        })
        .collect();
    let mut all = WorkerReport::default();
    for t in tasks {
        if let Ok(mut r) = t.await {
            all.latencies_us.append(&mut r.latencies_us);
            all.ok += r.ok;
            all.over += r.over;
            all.errors += r.errors;
        }
    }
    all.print(start.elapsed().as_secs_f64().max(1e-9))
}

impl Worker {
    async fn run(self, channel: Channel) -> WorkerReport {
        let mut client = RateLimitServiceClient::new(channel);
        let mut report = WorkerReport::default();
        let mut n = self.index;
        let mut ticker = self.interval.map(|i| {
            let phase = i.mul_f64(self.index as f64 / self.concurrency as f64);
            let mut t = tokio::time::interval_at(self.start + phase, i);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            t
        });
        loop {
            let sent_at = match &mut ticker {
                Some(t) => t.tick().await,
                None => Instant::now(),
            };
            if sent_at >= self.deadline {
                return report;
            }
            let req = RateLimitRequest {
                domain: self.domain.clone(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: self.key.clone(),
                        value: format!("v{}", n % self.values),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            };
            n += self.concurrency;
            match client.should_rate_limit(req).await {
                Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => report.over += 1,
                Ok(_) => report.ok += 1,
                Err(_) => report.errors += 1,
            }
            let us = sent_at.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
            report.latencies_us.push(us);
        }
    }
}

impl WorkerReport {
    /// Prints throughput and percentiles; fails when any call failed.
    fn print(mut self, elapsed: f64) -> ExitCode {
        self.latencies_us.sort_unstable();
        let lat = &self.latencies_us;
        let pct = |p: f64| -> f64 {
            if lat.is_empty() {
                return 0.0;
            }
            let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len());
            f64::from(lat[i - 1]) / 1000.0
        };
        let total = lat.len();
        println!(
            "requests {total} in {elapsed:.2}s: {:.0} req/s (ok {}, over_limit {}, errors {})",
            total as f64 / elapsed,
            self.ok,
            self.over,
            self.errors
        );
        println!(
            "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
            pct(0.50),
            pct(0.90),
            pct(0.99),
            pct(1.0)
        );
        if self.errors > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}
