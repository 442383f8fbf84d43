//! `sluice load --rlqs`: drives the quota service (`StreamRateLimitQuotas`) as a fleet of Envoys
//! would: each stream reports all its buckets every interval with the requests a fleet rate
//! spreads over them, and its responses are drained. It measures nothing itself: it is the
//! load `benches/rlqs_cpu.sh` puts on a server whose CPU it reads, and `benches/rlqs_memory.sh`
//! on one whose memory it reads (with `--bucket-id`, ids of any shape and size).

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
    /// The bucket ids, made from their numbers and the stream's.
    pub id: IdTemplate,
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

    /// The ids of the buckets of stream `stream` (from 0), in order.
    pub fn ids(&self, stream: u64) -> Vec<BucketId> {
        (0..self.buckets)
            .map(|i| self.id.bucket_id(stream, i))
            .collect()
    }

    /// A stream's report number `k` (from 0) of its buckets `ids` with the requests it stands
    /// for: the first subscribes every bucket (`time_elapsed` zero, as Envoy's first report of
    /// a bucket), each later one covers one interval.
    pub fn report(&self, k: u64, ids: &[BucketId]) -> (RateLimitQuotaUsageReports, u64) {
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
        let usages = ids
            .iter()
            .map(|id| BucketQuotaUsage {
                bucket_id: Some(id.clone()),
                time_elapsed,
                num_requests_allowed: allowed,
                num_requests_denied: 0,
            })
            .collect();
        let msg = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages,
        };
        (msg, allowed.saturating_mul(ids.len() as u64))
    }
}

/// `--bucket-id`: a bucket id as `key=value,...`, where `{i}` is the bucket's number, `{s}`
/// the stream's, and `{x:N}` N times `x` (an id of any size without a command line of that
/// size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdTemplate(Vec<(Vec<Piece>, Vec<Piece>)>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Bucket,
    Stream,
    Fill(usize),
}

/// Why a `--bucket-id` is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// An entry without `=`, or with an empty key or value.
    #[error("{0:?} is not key=value (both non-empty)")]
    NotAnEntry(String),
    /// A `{...}` that is not `{i}`, `{s}` or `{x:N}`.
    #[error("{0:?}: only {{i}}, {{s}} and {{x:N}} are replaced")]
    Placeholder(String),
}

// === impl IdTemplate ===

impl IdTemplate {
    /// Reads `key=value,...`.
    ///
    /// # Errors
    /// An entry that is not `key=value`, or an unknown placeholder.
    pub fn parse(s: &str) -> Result<IdTemplate, TemplateError> {
        let entries = s
            .split(',')
            .map(|entry| match entry.split_once('=') {
                Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((pieces(k)?, pieces(v)?)),
                _ => Err(TemplateError::NotAnEntry(entry.to_string())),
            })
            .collect::<Result<_, _>>()?;
        Ok(IdTemplate(entries))
    }

    /// The id of bucket `bucket` of stream `stream`.
    pub fn bucket_id(&self, stream: u64, bucket: u64) -> BucketId {
        let text = |pieces: &[Piece]| {
            let mut out = String::new();
            for p in pieces {
                match p {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Bucket => out.push_str(&bucket.to_string()),
                    Piece::Stream => out.push_str(&stream.to_string()),
                    Piece::Fill(n) => out.extend(std::iter::repeat_n('x', *n)),
                }
            }
            out
        };
        BucketId {
            bucket: self.0.iter().map(|(k, v)| (text(k), text(v))).collect(),
        }
    }
}

/// A key's or value's text and placeholders.
fn pieces(s: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        let bad = || TemplateError::Placeholder(rest[open..].to_string());
        let close = rest[open..].find('}').ok_or_else(bad)? + open;
        out.push(Piece::Text(rest[..open].to_string()));
        out.push(match &rest[open + 1..close] {
            "i" => Piece::Bucket,
            "s" => Piece::Stream,
            p => Piece::Fill(
                p.strip_prefix("x:")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?,
            ),
        });
        rest = &rest[close + 1..];
    }
    out.push(Piece::Text(rest.to_string()));
    Ok(out)
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
    let template = args
        .bucket_id
        .clone()
        .unwrap_or_else(|| format!("{}=v{{i}}", args.key));
    let id = match IdTemplate::parse(&template) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("sluice load --rlqs: --bucket-id {e}");
            return ExitCode::from(64);
        }
    };
    let plan = Plan {
        domain: args.domain.clone(),
        id,
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
            let stream = i as u64;
            tokio::spawn(envoy(
                channel,
                plan,
                stream,
                start + phase,
                start + duration,
            ))
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

/// One Envoy, stream number `stream`: reports from `first` every interval until `deadline`,
/// then ends its side and waits for the server to end the stream.
async fn envoy(
    channel: Channel,
    plan: Plan,
    stream: u64,
    first: Instant,
    deadline: Instant,
) -> Summary {
    let ids = plan.ids(stream);
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
        let (msg, requests) = plan.report(k, &ids);
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
    use std::collections::HashMap;

    use super::*;

    fn plan(rate: u64, interval_ms: u64) -> Plan {
        Plan {
            domain: "cpu".into(),
            id: IdTemplate::parse("user=v{i}").unwrap(),
            buckets: 1000,
            streams: 10,
            rate,
            interval: Duration::from_millis(interval_ms),
        }
    }

    #[test]
    fn the_first_report_subscribes_every_bucket_with_nothing_elapsed() {
        let p = plan(100_000, 1000);
        let (msg, requests) = p.report(0, &p.ids(0));
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
        let p = plan(100_000, 1000);
        let (msg, requests) = p.report(3, &p.ids(0));
        assert_eq!(requests, 10_000, "one Envoy's tenth of the fleet's second");
        let u = &msg.bucket_quota_usages[0];
        assert_eq!((u.num_requests_allowed, u.num_requests_denied), (10, 0));
        let elapsed = u.time_elapsed.unwrap();
        assert_eq!((elapsed.seconds, elapsed.nanos), (1, 0));
        let half = plan(100_000, 500)
            .report(1, &p.ids(0))
            .0
            .bucket_quota_usages[0]
            .time_elapsed;
        assert_eq!(half.unwrap().nanos, 500_000_000);
    }

    #[test]
    fn fractions_of_a_request_add_up_over_the_reports() {
        // 12,000 a second: 1.2 per bucket per Envoy per second, so 1,1,1,1,2.
        let p = plan(12_000, 1000);
        let ids = p.ids(0);
        let each: Vec<u64> = (1..=5)
            .map(|k| p.report(k, &ids).0.bucket_quota_usages[0].num_requests_allowed)
            .collect();
        assert_eq!(each, [1, 1, 1, 1, 2]);
        let total: u64 = (1..=10).map(|k| p.report(k, &ids).1).sum();
        assert_eq!(
            total, 12_000,
            "the fleet's 12,000 a second over 10 s, one Envoy's tenth"
        );
    }

    #[test]
    fn a_template_makes_each_streams_ids_of_any_size() {
        let t = IdTemplate::parse("name=chat,tenant=t-{s}-{i},pad{x:3}=v{x:5}").unwrap();
        let id = t.bucket_id(7, 42).bucket;
        let want = [("name", "chat"), ("tenant", "t-7-42"), ("padxxx", "vxxxxx")];
        assert_eq!(
            id,
            want.iter()
                .map(|&(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        );
        for bad in ["name", "name=", "=v", "a=b,,c=d"] {
            assert!(
                matches!(IdTemplate::parse(bad), Err(TemplateError::NotAnEntry(_))),
                "{bad}"
            );
        }
        for bad in ["a={n}", "a={x:}", "a={x:1", "a={i"] {
            assert!(
                matches!(IdTemplate::parse(bad), Err(TemplateError::Placeholder(_))),
                "{bad}"
            );
        }
    }
}
