//! Metrics and logs: per-rule counters with envoyproxy/ratelimit's meaning, the service's own
//! counters, their OpenTelemetry instruments and the Prometheus text rendering; log setup.
//!
//! Hot-path counters are plain atomics resolved ahead of time (a rule's [`RuleStats`] handle is
//! looked up when rules are compiled, not per request); OpenTelemetry reads them through
//! observable instruments at scrape time, so a request never hashes metric attributes.
//!
//! Per-rule series are bounded (README, "Limits and hostile input"): the operator's (one per
//! rule in force, dropped when a reload removes the rule) are kept apart from those made from
//! client input (limit overrides, `detailed_metric`/`value_to_metric` values), whose keys are
//! cut to `METRICS_MAX_KEY_BYTES` and whose number stops at `METRICS_MAX_CLIENT_SERIES`;
//! past it their hits go to the rule's own series, so no hit is lost. `/metrics` writes the
//! per-rule counters itself, every series exactly, rather than through the SDK, whose
//! cardinality limit folds extra series into one that reads a single value.

pub mod otel;
pub mod prometheus_ref;
pub mod statsd;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::{Counter, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{MeterProviderBuilder, SdkMeterProvider};
use parking_lot::RwLock;

/// Bounds of the series made from client input: request limit overrides (any client may
/// send one for a known domain) and `detailed_metric`/`value_to_metric` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesBounds {
    /// `METRICS_MAX_KEY_BYTES`: the longest client-made key, domain included, in bytes.
    /// A longer one keeps its first bytes and a hash of the whole ([`bounded_key`]).
    pub max_key_bytes: usize,
    /// `METRICS_MAX_CLIENT_SERIES`: most client-made series. Past it, hits are reported under
    /// the rule's own series (or the domain's `<domain>.override`), never lost.
    pub max_client_series: usize,
}

impl Default for SeriesBounds {
    fn default() -> Self {
        SeriesBounds {
            max_key_bytes: 512,
            max_client_series: 10_000,
        }
    }
}

/// The fewest bytes `METRICS_MAX_KEY_BYTES` may be: room for a prefix and the hash suffix.
pub const MIN_KEY_BYTES: usize = 64;

/// `key` cut to at most `max` bytes: the first bytes (on a character boundary), then `~`
/// and 16 hex digits of XXH3-64 of the whole key, so that distinct long keys stay distinct
/// series, and the same key gets the same name on every replica and after a restart.
pub fn bounded_key(key: &str, max: usize) -> std::borrow::Cow<'_, str> {
    const SUFFIX: usize = 17;
    if key.len() <= max {
        return key.into();
    }
    let mut cut = max.saturating_sub(SUFFIX);
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    format!("{}~{hash:016x}", &key[..cut]).into()
}

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
    /// Adds `n` to one of the counters, saturating at `u64::MAX` as the decisions' own counts
    /// do: a client's `hits_addend` of 2^64−1 must not wrap a counter below where it was
    /// (Prometheus would read a reset).
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        // The common case is one relaxed addition: a counter below 2^63 plus at most 2^32
        // cannot wrap, short of 2^31 additions landing between the load and the add.
        if n <= u64::from(u32::MAX) && counter.load(Ordering::Relaxed) < 1 << 63 {
            counter.fetch_add(n, Ordering::Relaxed);
        } else {
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(n))
            });
        }
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

/// A (domain, key) series name.
type SeriesKey = (String, String);

/// A client-made series and the operator series it belongs to (the rule's own key, or
/// `<domain>.override`): it goes when that one goes.
#[derive(Debug)]
struct ClientSeries {
    owner: String,
    stats: Arc<RuleStats>,
}

#[derive(Debug, Default)]
struct Series {
    /// The operator's: one per rule in force (registered when the rules are compiled, so
    /// present from the start), and each domain's `<domain>.override` once used.
    rules: HashMap<SeriesKey, Arc<RuleStats>>,
    /// Made from client input, at most `max_client_series` of them.
    client: HashMap<SeriesKey, ClientSeries>,
}

/// Every rule's stats, keyed by (domain, stats key). The operator's series and the
/// client-made ones are kept apart, so a flood of client-made keys can never push out (or
/// stand in for) the operator's; a series lives as long as its rule is in force, so counters
/// of unchanged rules stay monotonic across reloads, as Prometheus expects, and removed
/// rules' series go ([`RuleStatsRegistry::retain_rules`]).
#[derive(Debug, Default)]
pub struct RuleStatsRegistry {
    series: RwLock<Series>,
    bounds: RwLock<SeriesBounds>,
}

impl RuleStatsRegistry {
    /// Sets the bounds of client-made series (from the settings); series already made stay.
    pub fn set_bounds(&self, bounds: SeriesBounds) {
        *self.bounds.write() = bounds;
    }

    /// The bounds of client-made series.
    pub fn bounds(&self) -> SeriesBounds {
        *self.bounds.read()
    }

    /// The stats of an operator series (a rule's own key), created on first use. A
    /// client-made series of the same name becomes the operator's, counts and all.
    pub fn get(&self, domain: &str, key: &str) -> Arc<RuleStats> {
        let name = (domain.to_string(), key.to_string());
        if let Some(s) = self.series.read().rules.get(&name) {
            return s.clone();
        }
        let mut series = self.series.write();
        let promoted = series.client.remove(&name).map(|c| c.stats);
        series
            .rules
            .entry(name)
            .or_insert_with(|| promoted.unwrap_or_default())
            .clone()
    }

    /// The stats of a client-made key (cut to `max_key_bytes`), belonging to the operator
    /// series `owner`; `None` when `max_client_series` are already tracked and this key is
    /// not one of them: the caller then counts under `owner`.
    pub fn get_client(&self, domain: &str, key: &str, owner: &str) -> Option<Arc<RuleStats>> {
        let bounds = self.bounds();
        let name = (
            domain.to_string(),
            bounded_key(key, bounds.max_key_bytes).into_owned(),
        );
        {
            let series = self.series.read();
            if let Some(s) = series.rules.get(&name) {
                return Some(s.clone());
            }
            if let Some(c) = series.client.get(&name) {
                return Some(c.stats.clone());
            }
            if series.client.len() >= bounds.max_client_series {
                return None;
            }
        }
        let mut series = self.series.write();
        if let Some(s) = series.rules.get(&name) {
            return Some(s.clone());
        }
        let full = series.client.len() >= bounds.max_client_series;
        match series.client.entry(name) {
            std::collections::hash_map::Entry::Occupied(c) => Some(c.get().stats.clone()),
            std::collections::hash_map::Entry::Vacant(_) if full => None,
            std::collections::hash_map::Entry::Vacant(v) => Some(
                v.insert(ClientSeries {
                    owner: owner.to_string(),
                    stats: Arc::default(),
                })
                .stats
                .clone(),
            ),
        }
    }

    /// Keeps the operator series for which `keep(domain, key)` holds, and the client-made
    /// series whose owner is kept; drops the rest (the series of rules a reload removed).
    pub fn retain_rules(&self, keep: impl Fn(&str, &str) -> bool) {
        let mut series = self.series.write();
        series.rules.retain(|(d, k), _| keep(d, k));
        series.client.retain(|(d, _), c| keep(d, &c.owner));
    }

    /// How many series there are: (operator, client-made).
    pub fn len(&self) -> (usize, usize) {
        let series = self.series.read();
        (series.rules.len(), series.client.len())
    }

    /// Every series' stats, the operator's first, each part sorted by name.
    pub fn snapshot(&self) -> Vec<(SeriesKey, Arc<RuleStats>)> {
        let series = self.series.read();
        let mut rules: Vec<_> = series
            .rules
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut client: Vec<_> = series
            .client
            .iter()
            .map(|(k, c)| (k.clone(), c.stats.clone()))
            .collect();
        drop(series);
        rules.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        client.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        rules.extend(client);
        rules
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
    otlp_rule_counters: std::sync::Once,
}

/// Most series per rule counter exported over OTLP (the SDK keeps a map this large per
/// counter): every rule in force and `METRICS_MAX_CLIENT_SERIES` at its default, with room.
pub const OTLP_MAX_RULE_SERIES: usize = 100_000;

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
        let provider = builder
            .with_reader(exporter)
            .with_view(|i: &opentelemetry_sdk::metrics::Instrument| {
                // Room for every series the rule counters' callbacks observe, so the SDK never
                // folds some into its overflow series (which reads one value, not a sum).
                i.name().starts_with("ratelimit_").then(|| {
                    opentelemetry_sdk::metrics::Stream::builder()
                        .with_cardinality_limit(OTLP_MAX_RULE_SERIES)
                        .build()
                        .ok()
                })?
            })
            .build();
        let meter = provider.meter("sluice");
        let rules = Arc::new(RuleStatsRegistry::default());
        let service = Arc::new(ServiceStats::default());

        register_service_counters(&meter, &service);
        let config_loads = meter
            .u64_counter("sluice_config_load_total")
            .with_description("Rules loads, by result")
            .build();
        // Present from the start, so alerts on errors see a zero before the first failure.
        config_loads.add(0, &[KeyValue::new("result", "success")]);
        config_loads.add(0, &[KeyValue::new("result", "error")]);
        let t = Telemetry {
            registry,
            provider,
            meter,
            rules,
            service,
            config_loads,
            otlp_rule_counters: std::sync::Once::new(),
        };
        let rules = t.rules.clone();
        t.labelled_gauge(
            "sluice_metric_series",
            "Per-rule metric series, by kind: operator (one per rule in force) and client (made from client input, at most METRICS_MAX_CLIENT_SERIES)",
            Arc::new(move || {
                let (operator, client) = rules.len();
                [("operator", operator), ("client", client)]
                    .into_iter()
                    .map(|(kind, n)| (n as u64, vec![KeyValue::new("kind", kind)]))
                    .collect()
            }),
        );
        Ok(t)
    }

    /// Registers the per-rule counters as OpenTelemetry instruments, for the OTLP reader:
    /// `/metrics` renders them itself ([`Telemetry::render`]), exactly and whatever their
    /// number. At most [`OTLP_MAX_RULE_SERIES`] series per counter go over OTLP, the
    /// operator's first. Once; later calls do nothing.
    pub fn export_rule_counters(&self) {
        self.otlp_rule_counters
            .call_once(|| register_rule_counters(&self.meter, &self.rules));
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
        // The per-rule counters are written below, from the registry itself: the SDK's
        // instruments (there for OTLP) would cut them at their cardinality limit.
        let families: Vec<_> = self
            .registry
            .gather()
            .into_iter()
            .filter(|f| !f.name().starts_with("ratelimit_"))
            .collect();
        let _ = prometheus::TextEncoder::new().encode(&families, &mut out);
        let mut text = String::from_utf8(out).unwrap_or_default();
        write_rule_counters(&mut text, &self.rules);
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

/// The per-rule counters in the Prometheus text format, every series (the operator's and
/// the client-made ones, each bounded), labelled by domain and rule path.
fn write_rule_counters(out: &mut String, rules: &RuleStatsRegistry) {
    use std::fmt::Write as _;
    let series = rules.snapshot();
    for (suffix, help, read) in RULE_COUNTERS {
        let name = format!("ratelimit_{suffix}_total");
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for ((domain, key), s) in &series {
            let _ = writeln!(
                out,
                "{name}{{domain=\"{}\",rule=\"{}\"}} {}",
                label_value(domain),
                label_value(key),
                read(s)
            );
        }
    }
}

/// A label value as the Prometheus text format wants it.
pub fn label_value(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

/// The reference's per-rule counters as OpenTelemetry instruments (for OTLP), labelled by
/// domain and rule path: at most [`OTLP_MAX_RULE_SERIES`] series each.
fn register_rule_counters(meter: &Meter, rules: &Arc<RuleStatsRegistry>) {
    for (suffix, help, read) in RULE_COUNTERS {
        let rules = rules.clone();
        meter
            .u64_observable_counter(format!("ratelimit_{suffix}_total"))
            .with_description(help)
            .with_callback(move |obs| {
                let series = rules.snapshot();
                for ((domain, key), s) in series.into_iter().take(OTLP_MAX_RULE_SERIES) {
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
        assert!(
            text.contains(r#"sluice_metric_series{kind="operator"} 1"#)
                && text.contains(r#"sluice_metric_series{kind="client"} 0"#),
            "{text}"
        );
    }

    #[test]
    fn client_made_series_are_bounded_apart_from_the_operators() {
        let r = RuleStatsRegistry::default();
        r.set_bounds(SeriesBounds {
            max_key_bytes: 64,
            max_client_series: 3,
        });
        let own = r.get("d", "d.k");
        for i in 0..3 {
            assert!(r.get_client("d", &format!("d.k_{i}"), "d.k").is_some());
        }
        assert!(r.get_client("d", "d.k_one-too-many", "d.k").is_none());
        assert!(
            r.get_client("d", "d.k_1", "d.k").is_some(),
            "known keys stay available"
        );
        // Operator series are never refused, and a client key naming one shares it.
        let other = r.get("d", "d.other");
        assert!(Arc::ptr_eq(
            &r.get_client("d", "d.other", "d.k").unwrap(),
            &other
        ));
        assert!(!Arc::ptr_eq(&own, &other));
        assert_eq!(r.len(), (2, 3));
        // A reload that removes d.k drops its client-made series with it.
        r.retain_rules(|_, k| k == "d.other");
        assert_eq!(r.len(), (1, 0));
    }

    #[test]
    fn long_keys_are_cut_with_a_stable_hash() {
        let a = format!("d.k_{}", "é".repeat(100));
        let b = format!("{a}x");
        let (ka, kb) = (bounded_key(&a, 64), bounded_key(&b, 64));
        assert!(ka.len() <= 64 && kb.len() <= 64, "{ka} {kb}");
        assert_ne!(ka, kb);
        assert_eq!(ka, bounded_key(&a, 64), "the same key, the same name");
        assert!(ka.starts_with("d.k_é"));
        assert_eq!(bounded_key("d.k_v", 64), "d.k_v");
    }

    #[test]
    fn counters_saturate() {
        let c = AtomicU64::new(5);
        RuleStats::add(&c, u64::MAX);
        assert_eq!(c.load(Ordering::Relaxed), u64::MAX);
        RuleStats::add(&c, 1);
        assert_eq!(c.load(Ordering::Relaxed), u64::MAX);
        let c = AtomicU64::new(u64::MAX - 1);
        RuleStats::add(&c, 7);
        assert_eq!(c.load(Ordering::Relaxed), u64::MAX);
    }
}
