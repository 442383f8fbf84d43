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
//!
//! Files: this one (the pipeline, [`Telemetry`], and its registration helpers), `names.rs`
//! (every metric's name, help and kind), `rules.rs` (per-rule stats and their registry),
//! `service.rs` (the service's counters, the response-time histogram), `otel.rs` (OTLP
//! traces and metrics) with `trace_context.rs` (W3C/B3 headers), and the reference's
//! exporters: `statsd.rs` (`USE_STATSD`) and `prometheus_ref.rs` (`USE_PROMETHEUS`).

pub mod names;
pub mod otel;
pub mod prometheus_ref;
mod rules;
mod service;
pub mod statsd;
mod trace_context;

pub use names::{Kind, Metric, RULE_COUNTERS};
pub use rules::{
    bounded_key, ReadCounter, RuleStats, RuleStatsRegistry, SeriesBounds, MIN_KEY_BYTES,
};
pub use service::{ResponseTimes, ServiceStats, RESPONSE_BUCKETS_NS};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::{Counter, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{MeterProviderBuilder, SdkMeterProvider};

type GaugeFn = Arc<dyn Fn() -> u64 + Send + Sync>;
/// Reads a metric's series: each value with its labels.
pub type SeriesFn = Arc<dyn Fn() -> Vec<(u64, Vec<KeyValue>)> + Send + Sync>;

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
    /// Held while a scrape renders: one render at a time, however many scrapers.
    rendering: tokio::sync::Mutex<()>,
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

/// A row of a table of internal counters: the metric (from [`names`]), and how to read it
/// from the stats.
pub type CounterRow<S> = (Metric, fn(&S) -> u64);

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
                // Room for every series the rule counters' and the per-rule gauges' callbacks
                // observe, so the SDK never folds some into its overflow series (which reads
                // one value, not a sum).
                let per_rule = i.name().starts_with(names::RULE_COUNTER_PREFIX)
                    || i.name().starts_with(names::RULE_GAUGE_PREFIX);
                per_rule.then(|| {
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
            .u64_counter(names::CONFIG_LOADS.name)
            .with_description(names::CONFIG_LOADS.help)
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
            rendering: tokio::sync::Mutex::new(()),
        };
        t.labelled_gauge(
            names::BUILD_INFO,
            Arc::new(|| {
                let version = KeyValue::new("version", env!("CARGO_PKG_VERSION"));
                vec![(1, vec![version, KeyValue::new("commit", crate::COMMIT)])]
            }),
        );
        let rules = t.rules.clone();
        t.labelled_gauge(
            names::METRIC_SERIES,
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
    pub fn counter(&self, metric: Metric, read: SeriesFn) {
        debug_assert_eq!(metric.kind, Kind::Counter, "{}", metric.name);
        self.meter
            .u64_observable_counter(metric.name)
            .with_description(metric.help)
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
        for &(metric, read) in table {
            let s = stats.clone();
            self.counter(metric, Arc::new(move || vec![(read(&s), vec![])]));
        }
    }

    /// Registers a gauge read at scrape time, as (value, labels) series.
    pub fn labelled_gauge(&self, metric: Metric, read: SeriesFn) {
        debug_assert_eq!(metric.kind, Kind::Gauge, "{}", metric.name);
        self.meter
            .u64_observable_gauge(metric.name)
            .with_description(metric.help)
            .with_callback(move |obs| {
                for (v, labels) in read() {
                    obs.observe(v, &labels);
                }
            })
            .build();
    }

    /// Registers a gauge read at scrape time.
    pub fn gauge(&self, metric: Metric, read: GaugeFn) {
        self.labelled_gauge(metric, Arc::new(move || vec![(read(), vec![])]));
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
            .filter(|f| !f.name().starts_with(names::RULE_COUNTER_PREFIX))
            .collect();
        let _ = prometheus::TextEncoder::new().encode(&families, &mut out);
        let mut text = String::from_utf8(out).unwrap_or_default();
        write_rule_counters(&mut text, &self.rules);
        // A histogram of our own atomics, not an OpenTelemetry one: recording it must not
        // look up attributes on every request.
        self.service.response_time.write_prometheus(
            &mut text,
            names::REQUEST_DURATION.name,
            names::REQUEST_DURATION.help,
            "",
        );
        text
    }

    /// `render(self)` ([`Telemetry::render`], or the reference exporter's) on a blocking
    /// thread, one render at a time: at the rules files' bound of 200,000 overrides a render
    /// writes 73 MB of text, and on a runtime worker it held the requests queued behind it
    /// for as long (up to 0.8 s). Concurrent scrapes wait their turn, off the workers too.
    pub async fn render_off_workers(self: &Arc<Self>, render: fn(&Telemetry) -> String) -> String {
        let _one = self.rendering.lock().await;
        let t = self.clone();
        tokio::task::spawn_blocking(move || render(&t))
            .await
            .unwrap_or_default()
    }

    /// Flushes and stops the meter provider. Blocks while an OTLP reader sends its last
    /// export: call it off the runtime's workers.
    pub fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }
}

/// Installs the `tracing` subscriber: `level` as an env-filter directive ([`directive`]),
/// `format` `json` or text.
pub fn init_logging(level: &str, format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(directive(level))
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

/// The env-filter directive of `LOG_LEVEL`: `debug` is sluice's own debug lines (its
/// decisions among them) with every dependency at info, since their debug lines are HTTP/2
/// frame dumps (156 of them for one request, and no decision); `trace` is everything, and a
/// directive (with `=` or `,`) is taken as written.
pub fn directive(level: &str) -> String {
    let lower = level.to_ascii_lowercase();
    if lower == "debug" {
        "info,sluice=debug".into()
    } else {
        lower
    }
}

/// The per-rule counters in the Prometheus text format, every series (the operator's and
/// the client-made ones, each bounded), labelled by domain and rule path.
fn write_rule_counters(out: &mut String, rules: &RuleStatsRegistry) {
    use std::fmt::Write as _;
    let series = rules.labelled();
    // Each counter's line of each series (its name, the labels and a few digits): reserved
    // once, not regrown a line at a time.
    let labels: usize = series.iter().map(|(l, _)| l.len()).sum();
    let names: usize = RULE_COUNTERS
        .iter()
        .map(|(suffix, ..)| names::rule_counter_name(suffix).len() + 8)
        .sum();
    out.reserve(names * series.len() + RULE_COUNTERS.len() * labels);
    for (suffix, help, read) in RULE_COUNTERS {
        let name = names::rule_counter_name(suffix);
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, s) in &series {
            out.push_str(&name);
            out.push('{');
            out.push_str(labels);
            out.push_str("} ");
            let _ = writeln!(out, "{}", read(s));
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
            .u64_observable_counter(names::rule_counter_name(suffix))
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
    let svc: [(Metric, Vec<Series>); 4] = [
        (names::REQUESTS, vec![(None, |s| &s.requests)]),
        (
            names::REQUEST_ERRORS,
            vec![(Some(("reason", "invalid_argument")), |s| {
                &s.invalid_requests
            })],
        ),
        (
            names::DECISIONS,
            vec![
                (Some(("outcome", "ok")), |s| &s.decisions_ok),
                (Some(("outcome", "over_limit")), |s| &s.decisions_over),
                (Some(("outcome", "no_rule")), |s| &s.decisions_no_rule),
            ],
        ),
        (
            names::CACHE,
            vec![
                (Some(("result", "hit")), |s| &s.cache_hits),
                (Some(("result", "miss")), |s| &s.cache_misses),
            ],
        ),
    ];
    for (metric, series) in svc {
        let service = service.clone();
        meter
            .u64_observable_counter(metric.name)
            .with_description(metric.help)
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
    fn the_service_metrics_have_the_tables_names_and_help() {
        let text = Telemetry::new().unwrap().render();
        for m in [
            names::REQUESTS,
            names::REQUEST_ERRORS,
            names::DECISIONS,
            names::CACHE,
            names::CONFIG_LOADS,
            names::METRIC_SERIES,
            names::REQUEST_DURATION,
        ] {
            assert!(
                text.contains(&format!("# HELP {} {}\n", m.name, m.help)),
                "{}: {text}",
                m.name
            );
        }
    }

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

    /// A render that records how many renders run at once and where it ran: it holds on a
    /// moment so that renders not kept one at a time would overlap.
    fn recording(_: &Telemetry) -> String {
        use std::sync::atomic::AtomicUsize;
        static NOW: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        let n = NOW.fetch_add(1, Ordering::SeqCst) + 1;
        MOST.fetch_max(n, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(20));
        NOW.fetch_sub(1, Ordering::SeqCst);
        format!(
            "{:?} {}",
            std::thread::current().id(),
            MOST.load(Ordering::SeqCst)
        )
    }

    #[tokio::test(flavor = "current_thread")]
    async fn scrapes_render_off_the_runtime_one_at_a_time() {
        let t = Arc::new(Telemetry::new().unwrap());
        let here = format!("{:?}", std::thread::current().id());
        let renders = (0..4).map(|_| t.render_off_workers(recording));
        for out in futures_util::future::join_all(renders).await {
            let (thread, most) = out.split_once(' ').unwrap();
            assert_ne!(thread, here, "rendered on the runtime's thread");
            assert_eq!(most, "1", "renders at once");
        }
    }
}
