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

/// The largest UDP payload (IPv4): a longer line can never be sent, so it is dropped.
const MAX_LINE: usize = 65_507;

/// One line to send, and what to put back in `sent` if its datagram fails, so that its
/// growth goes with the next flush instead of being lost.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    text: String,
    key: String,
    before: u64,
}

/// Sends the counters' growth every flush until `stop`, and once more then. A datagram that
/// fails to send is logged and its lines' growth is sent with the next flush; the
/// datagrams after it still go.
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
            let (datagrams, dropped) = pack(deltas(&telemetry, &mut sent));
            if let Some(first) = dropped.first() {
                // Dropped once: its growth is already in `sent`, so it is not tried again.
                let name: String = first.chars().take(200).collect();
                tracing::warn!(
                    lines = dropped.len(),
                    first = %name,
                    "statsd: lines longer than a UDP datagram dropped"
                );
            }
            let mut failed = 0;
            let mut error = None;
            for (datagram, lines) in datagrams {
                if let Err(e) = socket.send_to(datagram.as_bytes(), &settings.addr).await {
                    failed += 1;
                    error.get_or_insert(e);
                    for l in lines {
                        sent.insert(l.key, l.before);
                    }
                }
            }
            if let Some(e) = error {
                tracing::warn!(error = %e, addr = %settings.addr, datagrams = failed, "statsd: send failed; sent again with the next flush");
            }
            if last {
                break;
            }
        }
    });
}

/// A statsd name part as the reference sanitizes stat names (`utils.SanitizeStatName`):
/// `:` and `|` become `_`, so a descriptor value cannot end the name early or forge a
/// line; control characters (a newline above all) too, which the reference leaves alone.
fn sanitize(name: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c == ':' || c == '|' || c.is_control();
    if !name.contains(bad) {
        return name.into();
    }
    name.chars()
        .map(|c| if bad(c) { '_' } else { c })
        .collect::<String>()
        .into()
}

/// The `name:delta|c` lines of every counter that grew since `sent`, which it replaces with
/// the current values: the names of series that are gone (rules removed by a reload) leave
/// it with them.
fn deltas(telemetry: &Telemetry, sent: &mut HashMap<String, u64>) -> Vec<Line> {
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
        let key = sanitize(&key);
        for (counter, _, pick) in RULE_COUNTERS {
            now.push((
                format!("ratelimit.service.rate_limit.{key}.{counter}"),
                pick(&stats),
            ));
        }
    }
    let mut next = HashMap::with_capacity(now.len() + RESPONSE_BUCKETS_NS.len() + 1);
    let mut lines = Vec::new();
    for (name, value) in now {
        let before = sent.get(&name).copied().unwrap_or(0);
        if value > before {
            lines.push(Line {
                text: format!("{name}:{}|c", value - before),
                key: name.clone(),
                before,
            });
        }
        next.insert(name, value);
    }
    lines.extend(response_times(&svc.response_time, sent, &mut next));
    *sent = next;
    lines
}

/// The reference's `ratelimit_server.ShouldRateLimit.response_time` timer (ms), from the
/// histogram rather than one line per call: for each bucket that grew by `n`, one sample of
/// the bucket's upper bound with a sample rate of `1/n`, which statsd servers (and
/// statsd_exporter) count as `n` samples. The bounds include statsd_exporter's default
/// buckets, so its histogram comes out as if every call had been sent. Calls past the last
/// bound (10 s) are sent as 20 s. Reads the last values from `sent`, writes them to `next`.
fn response_times(
    times: &ResponseTimes,
    sent: &HashMap<String, u64>,
    next: &mut HashMap<String, u64>,
) -> Vec<Line> {
    let mut lines = Vec::new();
    for (i, count) in times.counts().into_iter().enumerate() {
        let key = format!("response_time.{i}");
        let before = sent.get(&key).copied().unwrap_or(0);
        next.insert(key.clone(), count);
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
            lines.push(Line {
                text: format!("ratelimit_server.ShouldRateLimit.response_time:{ms}|ms{rate}"),
                key,
                before,
            });
        }
    }
    lines
}

/// Lines joined by newlines into datagrams of at most [`MAX_DATAGRAM`] bytes (a longer line
/// goes alone), each with its lines; and the lines too long for any datagram
/// ([`MAX_LINE`]), which are dropped.
fn pack(lines: Vec<Line>) -> (Vec<(String, Vec<Line>)>, Vec<String>) {
    let mut out: Vec<(String, Vec<Line>)> = Vec::new();
    let mut dropped = Vec::new();
    for line in lines {
        if line.text.len() > MAX_LINE {
            dropped.push(line.text);
            continue;
        }
        match out.last_mut() {
            Some((d, ls)) if d.len() + 1 + line.text.len() <= MAX_DATAGRAM => {
                d.push('\n');
                d.push_str(&line.text);
                ls.push(line);
            }
            _ => out.push((line.text.clone(), vec![line])),
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::RuleStats;

    fn texts(lines: &[Line]) -> Vec<&str> {
        lines.iter().map(|l| l.text.as_str()).collect()
    }

    fn line(text: String) -> Line {
        Line {
            key: text.clone(),
            text,
            before: 0,
        }
    }

    #[test]
    fn datagrams_stay_under_the_bound_and_keep_every_line() {
        let lines: Vec<String> = (0..200).map(|i| format!("a.b.{i}:1|c")).collect();
        let (packed, dropped) = pack(lines.iter().cloned().map(line).collect());
        assert!(packed.len() > 1 && dropped.is_empty());
        assert!(packed.iter().all(|(d, _)| d.len() <= MAX_DATAGRAM));
        let back: Vec<&str> = packed.iter().flat_map(|(d, _)| d.split('\n')).collect();
        assert_eq!(back, lines.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn a_line_past_any_datagram_is_dropped_and_the_rest_go() {
        let huge = format!("a.{}:1|c", "x".repeat(MAX_LINE));
        let (packed, dropped) = pack(vec![
            line("a.before:1|c".into()),
            line(huge.clone()),
            line("a.after:1|c".into()),
        ]);
        assert_eq!(dropped, vec![huge]);
        assert_eq!(packed.len(), 1);
        assert_eq!(packed[0].0, "a.before:1|c\na.after:1|c");
    }

    #[test]
    fn only_growth_is_sent() {
        let t = Telemetry::new().unwrap();
        let s = t.rules.get("d", "d.k_v");
        RuleStats::add(&s.total_hits, 3);
        let mut sent = HashMap::new();
        let first = deltas(&t, &mut sent);
        assert!(texts(&first).contains(&"ratelimit.service.rate_limit.d.k_v.total_hits:3|c"));
        assert!(deltas(&t, &mut sent).is_empty());
        RuleStats::add(&s.total_hits, 2);
        assert_eq!(
            texts(&deltas(&t, &mut sent)),
            vec!["ratelimit.service.rate_limit.d.k_v.total_hits:2|c"]
        );
    }

    #[test]
    fn a_failed_line_goes_again_with_the_next_flush_and_only_it() {
        let t = Telemetry::new().unwrap();
        let s = t.rules.get("d", "d.k");
        RuleStats::add(&s.total_hits, 3);
        RuleStats::add(&t.service.requests, 3);
        let mut sent = HashMap::new();
        let first = deltas(&t, &mut sent);
        // The datagram holding total_hits failed: its growth is put back.
        let failed = first
            .iter()
            .find(|l| l.text.contains("d.k.total_hits"))
            .unwrap();
        sent.insert(failed.key.clone(), failed.before);
        RuleStats::add(&s.total_hits, 1);
        assert_eq!(
            texts(&deltas(&t, &mut sent)),
            vec!["ratelimit.service.rate_limit.d.k.total_hits:4|c"]
        );
    }

    #[test]
    fn names_are_sanitized_as_the_reference_does() {
        assert_eq!(sanitize("d.k_v"), "d.k_v");
        assert_eq!(sanitize("d.k_a:1|c\nx.y:9|c\r"), "d.k_a_1_c_x.y_9_c_");
        let t = Telemetry::new().unwrap();
        RuleStats::add(
            &t.rules.get("d", "d.k_v:1|c\nforged:1000000|c").over_limit,
            1,
        );
        let lines = deltas(&t, &mut HashMap::new());
        assert!(
            texts(&lines).contains(
                &"ratelimit.service.rate_limit.d.k_v_1_c_forged_1000000_c.over_limit:1|c"
            ),
            "{lines:?}"
        );
        assert!(lines.iter().all(|l| !l.text.contains('\n')));
    }

    #[test]
    fn the_names_of_removed_series_are_forgotten() {
        let t = Telemetry::new().unwrap();
        RuleStats::add(&t.rules.get("d", "d.gone").total_hits, 1);
        let mut sent = HashMap::new();
        deltas(&t, &mut sent);
        assert!(sent.keys().any(|k| k.contains("d.gone")));
        t.rules.retain_rules(|_, _| false);
        deltas(&t, &mut sent);
        assert!(!sent.keys().any(|k| k.contains("d.gone")));
    }

    #[test]
    fn response_times_go_as_one_sampled_line_per_bucket() {
        use std::time::Duration;
        let t = ResponseTimes::default();
        let mut sent = HashMap::new();
        let flush = |sent: &mut HashMap<String, u64>| {
            let mut next = HashMap::new();
            let lines = response_times(&t, sent, &mut next);
            *sent = next;
            lines.into_iter().map(|l| l.text).collect::<Vec<_>>()
        };
        for us in [50, 100, 80, 3_000] {
            t.record(Duration::from_micros(us));
        }
        t.record(Duration::from_secs(11));
        assert_eq!(
            flush(&mut sent),
            vec![
                "ratelimit_server.ShouldRateLimit.response_time:0.1|ms|@0.3333333333333333",
                "ratelimit_server.ShouldRateLimit.response_time:5|ms",
                "ratelimit_server.ShouldRateLimit.response_time:20000|ms",
            ]
        );
        assert!(flush(&mut sent).is_empty(), "only growth is sent");
        t.record(Duration::from_micros(101));
        assert_eq!(
            flush(&mut sent),
            vec!["ratelimit_server.ShouldRateLimit.response_time:0.25|ms"]
        );
    }
}
