//! `sluice load --rlqs`: drives the quota service (`StreamRateLimitQuotas`) as a fleet of Envoys
//! would: each stream reports all its buckets every interval with the requests a fleet rate
//! spreads over them, and its responses are drained. It measures nothing itself: it is the
//! load `benches/rlqs_cpu.sh` puts on a server whose CPU it reads.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::connect;
use crate::cli::LoadArgs;

/// What every simulated Envoy reports: its buckets and the traffic each stands for.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The stream's domain.
    pub domain: String,
    /// The bucket ids' one key; bucket `i` is `{key: v<i>}`.
    pub key: String,
    /// Buckets each stream reports.
    pub buckets: u64,
    /// Streams (Envoys) in the fleet.
    pub streams: u64,
    /// Requests a second across the fleet, spread evenly over streams and buckets.
    pub rate: u64,
    /// Time between a stream's reports.
    pub interval: Duration,
}

/// What a run did, every stream together.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Envoy requests the reports stand for (their `num_requests_allowed`, summed).
    pub requests: u64,
    /// Report messages sent.
    pub reports: u64,
    /// Bucket usages in them.
    pub usages: u64,
    /// Bucket actions received.
    pub actions: u64,
    /// Streams that failed (refused, ended with an error, or cut).
    pub errors: u64,
}

// === impl Plan ===

impl Plan {
    /// The requests one bucket of one stream stands for in its first `k` intervals: the
    /// fleet's rate divided evenly, rounded down on the running total so that fractions
    /// (1.2 a report) add up over the reports instead of being lost on each.
    fn requests_through(&self, k: u64) -> u64 {
        let per = u128::from(self.streams.max(1)) * u128::from(self.buckets.max(1)) * 1000;
        let total = u128::from(k) * u128::from(self.rate) * self.interval.as_millis();
        u64::try_from(total / per).unwrap_or(u64::MAX)
    }

    /// The stream's report number `k` (from 0) with the requests it stands for: the first
    /// subscribes every bucket (`time_elapsed` zero, as Envoy's first report of a bucket),
    /// each later one covers one interval.
    pub fn report(&self, k: u64) -> (RateLimitQuotaUsageReports, u64) {
        let allowed = if k == 0 {
            0
        } else {
            self.requests_through(k) - self.requests_through(k - 1)
        };
        let elapsed = if k == 0 {
            Duration::ZERO
        } else {
            self.interval
        };
        let time_elapsed = Some(PbDuration {
            seconds: i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(elapsed.subsec_nanos()).unwrap_or(0),
        });
        let usages = (0..self.buckets)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: HashMap::from([(self.key.clone(), format!("v{i}"))]),
                }),
                time_elapsed,
                num_requests_allowed: allowed,
                num_requests_denied: 0,
            })
            .collect();
        let msg = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages,
        };
        (msg, allowed.saturating_mul(self.buckets))
    }
}

/// `sluice load --rlqs`: opens the streams, runs them for `--duration` and prints the summary;
/// fails when a stream failed.
pub async fn load_rlqs(args: &LoadArgs) -> ExitCode {
    let Some(rate) = args.rate else {
        eprintln!("sluice load --rlqs: --rate (requests a second across the fleet) is required");
        return ExitCode::from(64);
    };
    if args.streams == 0 || args.buckets == 0 || args.report_interval.is_zero() {
        eprintln!("sluice load --rlqs: --streams, --buckets and --report-interval must be above 0");
        return ExitCode::from(64);
    }
    let plan = Plan {
        domain: args.domain.clone(),
        key: args.key.clone(),
        buckets: args.buckets,
        streams: args.streams as u64,
        rate,
        interval: args.report_interval,
    };
    // One connection per Envoy, as each real one has its own.
    let mut channels = Vec::new();
    for _ in 0..args.streams {
        match connect(&args.addr).await {
            Ok(c) => channels.push(c),
            Err(e) => {
                eprintln!("sluice load --rlqs: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let start = Instant::now();
    let s = run(channels, &plan, args.duration).await;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    println!(
        "rlqs: {} streams x {} buckets, a report every {:?}: requests represented {} ({:.0}/s), \
         reports {}, bucket usages {}, bucket actions {}, errors {}",
        plan.streams,
        plan.buckets,
        plan.interval,
        s.requests,
        s.requests as f64 / secs,
        s.reports,
        s.usages,
        s.actions,
        s.errors
    );
    if s.errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs one stream per channel for `duration` and adds up what they did. The streams' report
/// times are spread over the interval, as independent Envoys' are.
pub async fn run(channels: Vec<Channel>, plan: &Plan, duration: Duration) -> Summary {
    let start = Instant::now();
    let n = channels.len().max(1) as u32;
    let tasks: Vec<_> = channels
        .into_iter()
        .enumerate()
        .map(|(i, channel)| {
            let phase = plan.interval * u32::try_from(i).unwrap_or(0) / n;
            let plan = plan.clone();
            tokio::spawn(envoy(channel, plan, start + phase, start + duration))
        })
        .collect();
    let mut all = Summary::default();
    for t in tasks {
        let s = t.await.unwrap_or(Summary {
            errors: 1,
            ..Summary::default()
        });
        all.requests += s.requests;
        all.reports += s.reports;
        all.usages += s.usages;
        all.actions += s.actions;
        all.errors += s.errors;
    }
    all
}

/// One Envoy: reports from `first` every interval until `deadline`, then ends its side and
/// waits for the server to end the stream.
async fn envoy(channel: Channel, plan: Plan, first: Instant, deadline: Instant) -> Summary {
    let mut s = Summary::default();
    let (tx, rx) = mpsc::channel(2);
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let mut responses = match client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(_) => {
            s.errors = 1;
            return s;
        }
    };
    // Responses are drained as they come, so the server never waits on this client.
    let drain = tokio::spawn(async move {
        let mut actions = 0u64;
        loop {
            match responses.message().await {
                Ok(Some(r)) => actions += r.bucket_action.len() as u64,
                Ok(None) => return (actions, 0),
                Err(_) => return (actions, 1),
            }
        }
    });
    let mut ticker = tokio::time::interval_at(first, plan.interval);
    // Late ticks are sent at once: the schedule, not the client's pace, decides how many.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for k in 0.. {
        if ticker.tick().await >= deadline {
            break;
        }
        let (msg, requests) = plan.report(k);
        if tx.send(msg).await.is_err() {
            break;
        }
        s.reports += 1;
        s.usages += plan.buckets;
        s.requests += requests;
    }
    drop(tx);
    let (actions, errors) = drain.await.unwrap_or((0, 1));
    s.actions = actions;
    s.errors = errors;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rate: u64, interval_ms: u64) -> Plan {
        Plan {
            domain: "cpu".into(),
            key: "user".into(),
            buckets: 1000,
            streams: 10,
            rate,
            interval: Duration::from_millis(interval_ms),
        }
    }

    #[test]
    fn the_first_report_subscribes_every_bucket_with_nothing_elapsed() {
        let (msg, requests) = plan(100_000, 1000).report(0);
        assert_eq!((msg.domain.as_str(), requests), ("cpu", 0));
        assert_eq!(msg.bucket_quota_usages.len(), 1000);
        let last = &msg.bucket_quota_usages[999];
        assert_eq!(
            last.bucket_id.as_ref().unwrap().bucket,
            HashMap::from([("user".to_string(), "v999".to_string())])
        );
        let zero = last.time_elapsed.unwrap();
        assert_eq!(
            (zero.seconds, zero.nanos, last.num_requests_allowed),
            (0, 0, 0)
        );
    }

    #[test]
    fn later_reports_carry_the_fleet_rate_spread_over_streams_and_buckets() {
        // 100,000 a second over 10 Envoys and 1,000 buckets: 10 per bucket per report.
        let (msg, requests) = plan(100_000, 1000).report(3);
        assert_eq!(requests, 10_000, "one Envoy's tenth of the fleet's second");
        let u = &msg.bucket_quota_usages[0];
        assert_eq!((u.num_requests_allowed, u.num_requests_denied), (10, 0));
        let elapsed = u.time_elapsed.unwrap();
        assert_eq!((elapsed.seconds, elapsed.nanos), (1, 0));
        let half = plan(100_000, 500).report(1).0.bucket_quota_usages[0].time_elapsed;
        assert_eq!(half.unwrap().nanos, 500_000_000);
    }

    #[test]
    fn fractions_of_a_request_add_up_over_the_reports() {
        // 12,000 a second: 1.2 per bucket per Envoy per second, so 1,1,1,1,2.
        let p = plan(12_000, 1000);
        let each: Vec<u64> = (1..=5)
            .map(|k| p.report(k).0.bucket_quota_usages[0].num_requests_allowed)
            .collect();
        assert_eq!(each, [1, 1, 1, 1, 2]);
        let total: u64 = (1..=10).map(|k| p.report(k).1).sum();
        assert_eq!(
            total, 12_000,
            "the fleet's 12,000 a second over 10 s, one Envoy's tenth"
        );
    }
}
