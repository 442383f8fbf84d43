//! The service's own counters ([`ServiceStats`]) and the response-time histogram kept in
//! atomics ([`ResponseTimes`]), which `/metrics`, statsd and the reference's Prometheus names
//! all read.

use std::sync::atomic::{AtomicU64, Ordering};

/// The service's own counters.
#[derive(Debug, Default)]
pub struct ServiceStats {
    /// `ShouldRateLimit` calls answered (gRPC and HTTP).
    pub requests: AtomicU64,
    /// Rules loads that were applied (at start and on reloads).
    pub config_load_success: AtomicU64,
    /// Rules loads that were rejected.
    pub config_load_error: AtomicU64,
    /// Requests refused as invalid.
    pub invalid_requests: AtomicU64,
    /// Descriptor decisions that were within every limit.
    pub decisions_ok: AtomicU64,
    /// Descriptor decisions that were over a limit.
    pub decisions_over: AtomicU64,
    /// Descriptors that matched no rule.
    pub decisions_no_rule: AtomicU64,
    /// Entity lookups that found counters in the cache.
    pub cache_hits: AtomicU64,
    /// Entity lookups that created counters.
    pub cache_misses: AtomicU64,
    /// Requests whose exact descriptors' store call failed (decided from memory instead):
    /// the reference's `redis_error`.
    pub redis_errors: AtomicU64,
    /// How long gRPC `ShouldRateLimit` calls took.
    pub response_time: ResponseTimes,
}

/// Upper bounds (ns) of the response-time buckets: 0.1 ms to 10 s. They include the
/// statsd_exporter's default buckets (5 ms to 10 s), which the reference's dashboards read.
pub const RESPONSE_BUCKETS_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// A histogram of response times in fixed buckets, kept in atomics: a request pays one
/// search of 16 bounds and two relaxed additions, and no lock.
#[derive(Debug, Default)]
pub struct ResponseTimes {
    /// Per bucket (not cumulative); the last one is past the last bound.
    counts: [AtomicU64; RESPONSE_BUCKETS_NS.len() + 1],
    sum_ns: AtomicU64,
}

impl ResponseTimes {
    /// Counts one call that took `elapsed`.
    pub fn record(&self, elapsed: std::time::Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let i = RESPONSE_BUCKETS_NS.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The per-bucket counts (the last past every bound).
    pub fn counts(&self) -> [u64; RESPONSE_BUCKETS_NS.len() + 1] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    /// Appends the histogram `name` with `labels` (`k="v",...`, or empty) in the Prometheus
    /// text format, in seconds.
    pub fn write_prometheus(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        use std::fmt::Write as _;
        let counts = self.counts();
        let sep = if labels.is_empty() { "" } else { "," };
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in RESPONSE_BUCKETS_NS.iter().zip(counts) {
            cumulative += count;
            let le = *bound as f64 / 1e9;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        cumulative += counts[RESPONSE_BUCKETS_NS.len()];
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}
