//! Metrics and logs: per-rule counters with envoyproxy/ratelimit's meaning, the service's own
//! counters, their OpenTelemetry instruments and the Prometheus text rendering; log setup.
//!
//! Hot-path counters are plain atomics resolved ahead of time (a rule's [`RuleStats`] handle is
//! looked up when rules are compiled, not per request); OpenTelemetry reads them through
//! observable instruments at scrape time, so a request never hashes metric attributes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::{Counter, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{MeterProviderBuilder, SdkMeterProvider};
use parking_lot::RwLock;

/// Most distinct `detailed_metric`/`value_to_metric` keys tracked; past it, hits are reported
/// under the rule's own key so a flood of distinct values cannot exhaust memory.
pub const MAX_DETAILED_KEYS: usize = 10_000;

/// Counters of one rule (or one detailed key), with the reference's meaning.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Hits seen.
    pub total_hits: AtomicU64,
    /// Hits over the limit.
    pub over_limit: AtomicU64,
    /// Hits within the limit but past `NEAR_LIMIT_RATIO` of it.
    pub near_limit: AtomicU64,
    /// Hits within the limit.
    pub within_limit: AtomicU64,
    /// Over-limit hits let through by shadow mode.
    pub shadow_mode: AtomicU64,
}

impl RuleStats {
    /// Adds `n` to one of the counters.
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Reads one counter of a rule's stats.
pub type ReadCounter = fn(&RuleStats) -> u64;

/// The reference's per-rule counters: the suffix of their names, what they count, and how to
/// read them. Every exporter of them reads this table: `/metrics` (`ratelimit_<suffix>_total`),
/// statsd (`server/statsd.rs`) and the reference's Prometheus names (`server/prometheus_ref.rs`).
pub const RULE_COUNTERS: [(&str, &str, ReadCounter); 5] = [
    ("total_hits", "Hits seen per rule", |s| {
        s.total_hits.load(Ordering::Relaxed)
    }),
    ("over_limit", "Hits over the limit per rule", |s| {
        s.over_limit.load(Ordering::Relaxed)
    }),
    (
        "near_limit",
        "Hits within the limit but past NEAR_LIMIT_RATIO of it",
        |s| s.near_limit.load(Ordering::Relaxed),
    ),
    ("within_limit", "Hits within the limit per rule", |s| {
        s.within_limit.load(Ordering::Relaxed)
    }),
    (
        "shadow_mode",
        "Over-limit hits let through by shadow mode",
        |s| s.shadow_mode.load(Ordering::Relaxed),
    ),
];

/// Every rule's stats, keyed by (domain, stats key). Entries outlive reloads so counters stay
/// monotonic, as Prometheus expects.
#[derive(Debug, Default)]
pub struct RuleStatsRegistry {
    map: RwLock<HashMap<(String, String), Arc<RuleStats>>>,
}

impl RuleStatsRegistry {
    /// The stats handle of a rule key, created on first use.
    pub fn get(&self, domain: &str, key: &str) -> Arc<RuleStats> {
        if let Some(s) = self.map.read().get(&(domain.to_string(), key.to_string())) {
            return s.clone();
        }
        self.map
            .write()
            .entry((domain.to_string(), key.to_string()))
            .or_default()
            .clone()
    }

    /// The stats of a detailed key, or `None` when [`MAX_DETAILED_KEYS`] are already tracked.
    pub fn get_detailed(&self, domain: &str, key: &str) -> Option<Arc<RuleStats>> {
        if self.map.read().len() >= MAX_DETAILED_KEYS
            && !self
                .map
                .read()
                .contains_key(&(domain.to_string(), key.to_string()))
        {
            return None;
        }
        Some(self.get(domain, key))
    }

    /// Every tracked key's stats.
    pub fn snapshot(&self) -> Vec<((String, String), Arc<RuleStats>)> {
        self.map
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

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

type GaugeFn = Arc<dyn Fn() -> u64 + Send + Sync>;
type SeriesFn = Arc<dyn Fn() -> Vec<(u64, Vec<KeyValue>)> + Send + Sync>;

/// The metrics pipeline: an OpenTelemetry meter provider exporting into a Prometheus registry.
pub struct Telemetry {
    registry: prometheus::Registry,
    provider: SdkMeterProvider,
    meter: Meter,
    /// Per-rule counters.
    pub rules: Arc<RuleStatsRegistry>,
    /// Service counters.
    pub service: Arc<ServiceStats>,
    config_loads: Counter<u64>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

/// The outcome of a rules load, as counted in `config_load_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigLoad {
    /// The new rules were swapped in.
    Success,
    /// The files were rejected; the rules in force stayed.
    Error,
}

/// A row of a table of internal counters: name, help, and how to read it from the stats.
pub type CounterRow<S> = (&'static str, &'static str, fn(&S) -> u64);

impl Telemetry {
    /// Builds the pipeline and registers every instrument.
    ///
    /// # Errors
    /// When the Prometheus exporter cannot be built.
    pub fn new() -> Result<Self, opentelemetry_sdk::error::OTelSdkError> {
        Self::with_builder(SdkMeterProvider::builder())
    }

    /// As [`Telemetry::new`], on a provider builder that may hold other readers already (the
    /// OTLP one, `otel.rs`): every reader sees the same instruments.
    ///
    /// # Errors
    /// When the Prometheus exporter cannot be built.
    pub fn with_builder(
        builder: MeterProviderBuilder,
    ) -> Result<Self, opentelemetry_sdk::error::OTelSdkError> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_target_info()
            .scope_info_enabled(false)
            .without_counter_suffixes()
            .build()?;
        let provider = builder.with_reader(exporter).build();
        let meter = provider.meter("sluice");
        let rules = Arc::new(RuleStatsRegistry::default());
        let service = Arc::new(ServiceStats::default());

        register_rule_counters(&meter, &rules);
        register_service_counters(&meter, &service);
        let config_loads = meter
            .u64_counter("sluice_config_load_total")
            .with_description("Rules loads, by result")
            .build();
        // Present from the start, so alerts on errors see a zero before the first failure.
        config_loads.add(0, &[KeyValue::new("result", "success")]);
        config_loads.add(0, &[KeyValue::new("result", "error")]);
        Ok(Telemetry {
            registry,
            provider,
            meter,
            rules,
            service,
            config_loads,
        })
    }

    /// Counts a rules load.
    pub fn config_load(&self, outcome: ConfigLoad) {
        let (result, count) = match outcome {
            ConfigLoad::Success => ("success", &self.service.config_load_success),
            ConfigLoad::Error => ("error", &self.service.config_load_error),
        };
        RuleStats::add(count, 1);
        self.config_loads.add(1, &[KeyValue::new("result", result)]);
    }

    /// Registers a counter read at scrape time, as (value, labels) series.
    pub fn counter(&self, name: &'static str, help: &'static str, read: SeriesFn) {
        self.meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |obs| {
                for (v, labels) in read() {
                    obs.observe(v, &labels);
                }
            })
            .build();
    }

    /// Registers one unlabelled counter per [`CounterRow`], each read from `stats`
    /// at scrape time: the shape of every table of internal counters.
    pub fn counter_table<S: Send + Sync + 'static>(&self, stats: &Arc<S>, table: &[CounterRow<S>]) {
        for &(name, help, read) in table {
            let s = stats.clone();
            self.counter(name, help, Arc::new(move || vec![(read(&s), vec![])]));
        }
    }

    /// Registers a gauge read at scrape time, as (value, labels) series.
    pub fn labelled_gauge(&self, name: &'static str, help: &'static str, read: SeriesFn) {
        self.meter
            .u64_observable_gauge(name)
            .with_description(help)
            .with_callback(move |obs| {
                for (v, labels) in read() {
                    obs.observe(v, &labels);
                }
            })
            .build();
    }

    /// Registers a gauge read at scrape time.
    pub fn gauge(&self, name: &'static str, help: &'static str, read: GaugeFn) {
        self.labelled_gauge(name, help, Arc::new(move || vec![(read(), vec![])]));
    }

    /// The current metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        use prometheus::Encoder as _;
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        let mut text = String::from_utf8(out).unwrap_or_default();
        // A histogram of our own atomics, not an OpenTelemetry one: recording it must not
        // look up attributes on every request.
        self.service.response_time.write_prometheus(
            &mut text,
            "sluice_request_duration_seconds",
            "How long gRPC ShouldRateLimit calls took",
            "",
        );
        text
    }

    /// Flushes and stops the meter provider. Blocks while an OTLP reader sends its last
    /// export: call it off the runtime's workers.
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

/// Installs the `tracing` subscriber: `level` as an env-filter directive, `format` `json` or text.
pub fn init_logging(level: &str, format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level.to_ascii_lowercase())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if format.eq_ignore_ascii_case("json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The reference's per-rule counters, labelled by domain and rule path.
fn register_rule_counters(meter: &Meter, rules: &Arc<RuleStatsRegistry>) {
    for (suffix, help, read) in RULE_COUNTERS {
        let rules = rules.clone();
        meter
            .u64_observable_counter(format!("ratelimit_{suffix}_total"))
            .with_description(help)
            .with_callback(move |obs| {
                for ((domain, key), s) in rules.snapshot() {
                    obs.observe(
                        read(&s),
                        &[KeyValue::new("domain", domain), KeyValue::new("rule", key)],
                    );
                }
            })
            .build();
    }
}

/// The service's own counters: requests, refusals, decisions, cache lookups.
fn register_service_counters(meter: &Meter, service: &Arc<ServiceStats>) {
    type Series = (
        Option<(&'static str, &'static str)>,
        fn(&ServiceStats) -> &AtomicU64,
    );
    let svc: [(&str, &str, Vec<Series>); 4] = [
        (
            "sluice_requests_total",
            "ShouldRateLimit calls answered",
            vec![(None, |s| &s.requests)],
        ),
        (
            "sluice_request_errors_total",
            "Requests refused, by reason",
            vec![(Some(("reason", "invalid_argument")), |s| {
                &s.invalid_requests
            })],
        ),
        (
            "sluice_decisions_total",
            "Descriptor decisions, by outcome",
            vec![
                (Some(("outcome", "ok")), |s| &s.decisions_ok),
                (Some(("outcome", "over_limit")), |s| &s.decisions_over),
                (Some(("outcome", "no_rule")), |s| &s.decisions_no_rule),
            ],
        ),
        (
            "sluice_cache_total",
            "Entity cache lookups, by result",
            vec![
                (Some(("result", "hit")), |s| &s.cache_hits),
                (Some(("result", "miss")), |s| &s.cache_misses),
            ],
        ),
    ];
    for (name, help, series) in svc {
        let service = service.clone();
        meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |obs| {
                for (label, pick) in &series {
                    let attrs: Vec<KeyValue> =
                        label.iter().map(|(k, v)| KeyValue::new(*k, *v)).collect();
                    obs.observe(pick(&service).load(Ordering::Relaxed), &attrs);
                }
            })
            .build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rule_and_service_counters() {
        let t = Telemetry::new().unwrap();
        let s = t.rules.get("d", "d.k_v");
        RuleStats::add(&s.total_hits, 3);
        RuleStats::add(&s.over_limit, 1);
        RuleStats::add(&t.service.cache_misses, 2);
        t.config_load(ConfigLoad::Success);
        let text = t.render();
        assert!(
            text.contains(r#"ratelimit_total_hits_total{domain="d",rule="d.k_v"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ratelimit_over_limit_total{domain="d",rule="d.k_v"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sluice_cache_total{result="miss"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"sluice_config_load_total{result="success"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn detailed_keys_are_bounded() {
        let r = RuleStatsRegistry::default();
        for i in 0..MAX_DETAILED_KEYS {
            assert!(r.get_detailed("d", &i.to_string()).is_some());
        }
        assert!(r.get_detailed("d", "one-too-many").is_none());
        assert!(
            r.get_detailed("d", "7").is_some(),
            "known keys stay available"
        );
    }
}
