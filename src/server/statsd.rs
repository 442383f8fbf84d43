//! `USE_STATSD`: the reference's statsd counters, sent over UDP every `STATS_FLUSH_INTERVAL`
//! as deltas since the last flush: `ratelimit.service.rate_limit.<rule key>.<counter>` for
//! `total_hits`, `over_limit`, `near_limit`, `within_limit` and `shadow_mode`,
//! `ratelimit_server.ShouldRateLimit.total_requests` and `.response_time`,
//! `ratelimit.service.call.should_rate_limit.service_error|redis_error`, and
//! `ratelimit.service.config_load_success|error`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use crate::telemetry::{ResponseTimes, Telemetry, RESPONSE_BUCKETS_NS, RULE_COUNTERS};

/// Where and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdSettings {
    /// `STATSD_HOST:STATSD_PORT`.
    pub addr: String,
    /// `STATS_FLUSH_INTERVAL`.
    pub flush: Duration,
}

/// Datagrams stay under a typical path MTU, so none is fragmented or dropped for size.
const MAX_DATAGRAM: usize = 1432;

/// Sends the counters' growth every flush until `stop`, and once more then. A send that
/// fails is logged and its deltas are sent with the next flush.
pub fn spawn(settings: StatsdSettings, telemetry: Arc<Telemetry>, stop: CancellationToken) {
    tokio::spawn(async move {
        let socket = match UdpSocket::bind("0.0.0.0:0").await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "statsd: cannot open a UDP socket; no statsd metrics");
                return;
            }
        };
        let mut sent: HashMap<String, u64> = HashMap::new();
        let mut every = tokio::time::interval(settings.flush);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                _ = stop.cancelled() => true,
                _ = every.tick() => false,
            };
            let lines = deltas(&telemetry, &mut sent);
            for datagram in pack(&lines) {
                if let Err(e) = socket.send_to(datagram.as_bytes(), &settings.addr).await {
                    tracing::warn!(error = %e, addr = %settings.addr, "statsd: send failed");
                    // Sent again, whole, with the next flush.
                    sent.clear();
                    break;
                }
            }
            if last {
                break;
            }
        }
    });
}

/// The `name:delta|c` lines of every counter that grew since `sent`, which it updates.
fn deltas(telemetry: &Telemetry, sent: &mut HashMap<String, u64>) -> Vec<String> {
    let svc = &telemetry.service;
    let mut now: Vec<(String, u64)> = vec![
        (
            "ratelimit_server.ShouldRateLimit.total_requests".into(),
            svc.requests.load(Ordering::Relaxed),
        ),
        (
            "ratelimit.service.config_load_success".into(),
            svc.config_load_success.load(Ordering::Relaxed),
        ),
        (
            "ratelimit.service.config_load_error".into(),
            svc.config_load_error.load(Ordering::Relaxed),
        ),
        (
            "ratelimit.service.call.should_rate_limit.service_error".into(),
            svc.invalid_requests.load(Ordering::Relaxed),
        ),
        (
            "ratelimit.service.call.should_rate_limit.redis_error".into(),
            svc.redis_errors.load(Ordering::Relaxed),
        ),
    ];
    for ((_, key), stats) in telemetry.rules.snapshot() {
        for (counter, _, pick) in RULE_COUNTERS {
            now.push((
                format!("ratelimit.service.rate_limit.{key}.{counter}"),
                pick(&stats),
            ));
        }
    }
    let mut lines = Vec::new();
    for (name, value) in now {
        let before = sent.insert(name.clone(), value).unwrap_or(0);
        if value > before {
            lines.push(format!("{name}:{}|c", value - before));
        }
    }
    lines.extend(response_times(&svc.response_time, sent));
    lines
}

/// The reference's `ratelimit_server.ShouldRateLimit.response_time` timer (ms), from the
/// histogram rather than one line per call: for each bucket that grew by `n`, one sample of
/// the bucket's upper bound with a sample rate of `1/n`, which statsd servers (and
/// statsd_exporter) count as `n` samples. The bounds include statsd_exporter's default
/// buckets, so its histogram comes out as if every call had been sent. Calls past the last
/// bound (10 s) are sent as 20 s.
fn response_times(times: &ResponseTimes, sent: &mut HashMap<String, u64>) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, count) in times.counts().into_iter().enumerate() {
        let before = sent
            .insert(format!("response_time.{i}"), count)
            .unwrap_or(0);
        if count > before {
            let bound_ns = RESPONSE_BUCKETS_NS
                .get(i)
                .copied()
                .unwrap_or(20_000_000_000);
            let ms = bound_ns as f64 / 1e6;
            let n = count - before;
            let rate = if n == 1 {
                String::new()
            } else {
                format!("|@{}", 1.0 / n as f64)
            };
            lines.push(format!(
                "ratelimit_server.ShouldRateLimit.response_time:{ms}|ms{rate}"
            ));
        }
    }
    lines
}

/// Lines joined by newlines into datagrams of at most [`MAX_DATAGRAM`] bytes (a longer line
/// goes alone).
fn pack(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in lines {
        match out.last_mut() {
            Some(d) if d.len() + 1 + line.len() <= MAX_DATAGRAM => {
                d.push('\n');
                d.push_str(line);
            }
            _ => out.push(line.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::RuleStats;

    #[test]
    fn datagrams_stay_under_the_bound_and_keep_every_line() {
        let lines: Vec<String> = (0..200).map(|i| format!("a.b.{i}:1|c")).collect();
        let packed = pack(&lines);
        assert!(packed.len() > 1);
        assert!(packed.iter().all(|d| d.len() <= MAX_DATAGRAM));
        let back: Vec<&str> = packed.iter().flat_map(|d| d.split('\n')).collect();
        assert_eq!(back, lines.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn only_growth_is_sent() {
        let t = Telemetry::new().unwrap();
        let s = t.rules.get("d", "d.k_v");
        RuleStats::add(&s.total_hits, 3);
        let mut sent = HashMap::new();
        let first = deltas(&t, &mut sent);
        assert!(first.contains(&"ratelimit.service.rate_limit.d.k_v.total_hits:3|c".into()));
        assert!(deltas(&t, &mut sent).is_empty());
        RuleStats::add(&s.total_hits, 2);
        assert_eq!(
            deltas(&t, &mut sent),
            vec!["ratelimit.service.rate_limit.d.k_v.total_hits:2|c".to_string()]
        );
    }

    #[test]
    fn response_times_go_as_one_sampled_line_per_bucket() {
        use std::time::Duration;
        let t = ResponseTimes::default();
        let mut sent = HashMap::new();
        for us in [50, 100, 80, 3_000] {
            t.record(Duration::from_micros(us));
        }
        t.record(Duration::from_secs(11));
        assert_eq!(
            response_times(&t, &mut sent),
            vec![
                "ratelimit_server.ShouldRateLimit.response_time:0.1|ms|@0.3333333333333333",
                "ratelimit_server.ShouldRateLimit.response_time:5|ms",
                "ratelimit_server.ShouldRateLimit.response_time:20000|ms",
            ]
        );
        assert!(
            response_times(&t, &mut sent).is_empty(),
            "only growth is sent"
        );
        t.record(Duration::from_micros(101));
        assert_eq!(
            response_times(&t, &mut sent),
            vec!["ratelimit_server.ShouldRateLimit.response_time:0.25|ms"]
        );
    }
}
