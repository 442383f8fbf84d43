//! `sluice serve`'s flags: the settings table and the clap arguments built from it.
//!
//! `serve`'s flags are built from [`SERVE`], one row per setting (variable, flag, default,
//! help), and are taken as raw strings: clap does not read the environment for them and
//! parses no value, so one run reports every bad setting at once (`Settings::resolve` does
//! the parsing) and `--help` never shows an environment value, a password included.

use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches};

/// How a setting's flag takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `--flag VALUE`.
    Value,
    /// `--flag` alone means true; `--flag false` etc. also work (the reference's booleans).
    Bool,
    /// Repeatable, and comma-separated like the variable.
    List,
    /// A testing aid, not in `--help`; the value may start with `-`.
    Hidden,
}

/// One setting of `sluice serve`: a row of [`SERVE`].
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The environment variable, envoyproxy/ratelimit's name where it has one; also the
    /// setting's name in errors.
    pub env: &'static str,
    /// The long flag, without `--`.
    pub flag: &'static str,
    /// The value when neither flag nor variable gives one.
    pub default: Option<&'static str>,
    /// How the flag takes its value.
    pub shape: Shape,
    /// A secret: its value is never shown in errors or `Debug`.
    pub secret: bool,
    /// The `--help` line.
    pub help: &'static str,
}

const fn spec(
    env: &'static str,
    flag: &'static str,
    default: Option<&'static str>,
    help: &'static str,
) -> Spec {
    Spec {
        env,
        flag,
        default,
        shape: Shape::Value,
        secret: false,
        help,
    }
}

const fn boolean(env: &'static str, flag: &'static str, help: &'static str) -> Spec {
    Spec {
        env,
        flag,
        default: Some("false"),
        shape: Shape::Bool,
        secret: false,
        help,
    }
}

/// Every setting of `sluice serve`, in `--help` order.
#[rustfmt::skip]
pub const SERVE: &[Spec] = &[
    spec("SLUICE_CONFIG", "config", None, "Rules: a YAML file or a directory of *.yaml/*.yml files. Default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY when RUNTIME_ROOT is set, else config/rules"),
    spec("RUNTIME_ROOT", "runtime-root", None, "envoyproxy/ratelimit's runtime root"),
    spec("RUNTIME_SUBDIRECTORY", "runtime-subdirectory", Some(""), "envoyproxy/ratelimit's runtime subdirectory"),
    spec("RUNTIME_APPDIRECTORY", "runtime-appdirectory", Some("config"), "envoyproxy/ratelimit's runtime app directory"),
    spec("CONFIG_TYPE", "config-type", Some("FILE"), "Where the rules come from: FILE (SLUICE_CONFIG or the runtime directories) or GRPC_XDS_SOTW (an xDS management server)"),
    boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", "force-start-without-initial-config", "xDS: be ready before the first rule set arrives (until then nothing is limited)"),
    boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "healthy-with-at-least-one-config-loaded", "xDS: be ready only while the rules in force have at least one domain"),
    spec("CONFIG_GRPC_XDS_SERVER_URL", "config-grpc-xds-server-url", Some("localhost:18000"), "xDS: host:port of the management server"),
    spec("CONFIG_GRPC_XDS_NODE_ID", "config-grpc-xds-node-id", Some("default"), "xDS: the node id sluice presents"),
    spec("CONFIG_GRPC_XDS_NODE_METADATA", "config-grpc-xds-node-metadata", Some(""), "xDS: node metadata as key=value pairs separated by commas"),
    spec("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "config-grpc-xds-server-connect-retry-interval", Some("3s"), "xDS: first wait before reconnecting; doubles per failed attempt"),
    spec("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "xds-client-backoff-max-interval", Some("60s"), "xDS: longest wait between reconnection attempts"),
    spec("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "xds-client-max-msg-size-in-bytes", None, "xDS: largest response accepted, in bytes (default 4 MiB)"),
    Spec { secret: true, ..spec("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "config-grpc-xds-client-additional-headers", None, "xDS: headers sent on the stream, name:value pairs separated by commas") },
    boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", "config-grpc-xds-server-use-tls", "xDS: TLS to the management server"),
    spec("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "config-grpc-xds-client-tls-cert", None, "xDS: client certificate chain (PEM file) for mTLS"),
    spec("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "config-grpc-xds-client-tls-key", None, "xDS: client private key (PEM file)"),
    spec("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "config-grpc-xds-server-tls-cacert", None, "xDS: CA bundle (PEM file) the server must chain to (default: the system's roots)"),
    spec("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "config-grpc-xds-server-tls-san", None, "xDS: name the server certificate must carry (default: the URL's host)"),
    spec("GRPC_ADDR", "grpc-addr", None, "gRPC listen address; overrides GRPC_HOST/GRPC_PORT"),
    spec("GRPC_HOST", "grpc-host", Some("0.0.0.0"), "gRPC listen host"),
    spec("GRPC_PORT", "grpc-port", Some("8081"), "gRPC listen port"),
    boolean("GRPC_SERVER_USE_TLS", "grpc-server-use-tls", "Serve gRPC over TLS with GRPC_SERVER_TLS_CERT/KEY (re-read when the files change)"),
    spec("GRPC_SERVER_TLS_CERT", "grpc-server-tls-cert", None, "gRPC server certificate chain (PEM file), leaf first"),
    spec("GRPC_SERVER_TLS_KEY", "grpc-server-tls-key", None, "gRPC server private key (PEM file)"),
    spec("GRPC_CLIENT_TLS_CACERT", "grpc-client-tls-cacert", None, "CA bundle (PEM file): set, gRPC clients must present a certificate it signed (mTLS)"),
    spec("GRPC_CLIENT_TLS_SAN", "grpc-client-tls-san", None, "DNS name or IP the client certificate must carry as a SAN (needs GRPC_CLIENT_TLS_CACERT)"),
    spec("GRPC_MAX_CONNECTIONS", "grpc-max-connections", Some("4096"), "Most gRPC connections served at once (at least 1; lowered to fit the open-files limit); more wait in the kernel's accept queue"),
    spec("GRPC_MAX_CONCURRENT_STREAMS", "grpc-max-concurrent-streams", Some("100"), "HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: requests one gRPC connection may have open at once"),
    spec("GRPC_MAX_CONCURRENT_REQUESTS", "grpc-max-concurrent-requests", Some("10000"), "gRPC requests in flight across all connections; past it a request is answered RESOURCE_EXHAUSTED at once"),
    spec("GRPC_REQUEST_TIMEOUT", "grpc-request-timeout", Some("10s"), "Longest a gRPC request may take, its body included (answered CANCELLED past it)"),
    spec("GRPC_HANDSHAKE_TIMEOUT", "grpc-handshake-timeout", Some("10s"), "Time a gRPC client has, from accept, to finish TLS and send the HTTP/2 preface"),
    spec("GRPC_IDLE_TIMEOUT", "grpc-idle-timeout", Some("5m"), "A gRPC connection whose client sends nothing for this long is closed"),
    spec("HTTP_ADDR", "http-addr", None, "HTTP listen address; overrides HOST/PORT"),
    spec("HOST", "host", Some("0.0.0.0"), "HTTP listen host"),
    spec("PORT", "port", Some("8080"), "HTTP listen port"),
    spec("HTTP_HEADER_READ_TIMEOUT", "http-header-read-timeout", Some("10s"), "Time an HTTP client has to send a request's headers"),
    spec("HTTP_IDLE_TIMEOUT", "http-idle-timeout", Some("60s"), "An idle HTTP keep-alive connection is closed after this long"),
    spec("HTTP_MAX_CONNECTIONS", "http-max-connections", Some("256"), "Most HTTP connections served at once (at least 1)"),
    spec("LOG_LEVEL", "log-level", Some("info"), "Log level (trace, debug, info, warn, error) or an env-filter directive"),
    spec("LOG_FORMAT", "log-format", Some("text"), "Log format: text or json"),
    boolean("SHADOW_MODE", "shadow-mode", "Report OK overall whatever the outcome (per-descriptor statuses are kept)"),
    boolean("QUOTA_MODE", "quota-mode", "Treat every rule as a quota (see quota_mode)"),
    boolean("LIMIT_RESPONSE_HEADERS_ENABLED", "limit-response-headers-enabled", "Add RateLimit-Limit/-Remaining/-Reset (and Retry-After when over) response headers"),
    spec("LIMIT_LIMIT_HEADER", "limit-limit-header", Some("RateLimit-Limit"), "Name of the limit header"),
    spec("LIMIT_REMAINING_HEADER", "limit-remaining-header", Some("RateLimit-Remaining"), "Name of the remaining header"),
    spec("LIMIT_RESET_HEADER", "limit-reset-header", Some("RateLimit-Reset"), "Name of the reset header"),
    spec("LIMIT_RESPONSE_HEADERS_FORMAT", "limit-response-headers-format", Some("reference"), "Which rate-limit headers LIMIT_RESPONSE_HEADERS_ENABLED adds: reference (RateLimit-Limit/-Remaining/-Reset) or ietf (draft-ietf-httpapi-ratelimit-headers-11's RateLimit-Policy and RateLimit)"),
    spec("LIMIT_RESPONSE_BODY", "limit-response-body", Some("none"), "Body of a refused request's response: none, or problem (an RFC 9457 application/problem+json quota-exceeded body naming the violated policies)"),
    boolean("RESPONSE_DYNAMIC_METADATA", "response-dynamic-metadata", "Add dynamic metadata to responses: the domain, the descriptors, the hits and the merged rule metadata of the descriptors within their limits"),
    boolean("RESPONSE_RULE_METADATA", "response-rule-metadata", "Add dynamic metadata naming the rules that denied a request, and those in shadow mode that would have (sluice.denied_by, sluice.shadow_denied_by), for Envoy's access log"),
    boolean("USE_PROMETHEUS", "use-prometheus", "Also serve the reference's metrics under its Prometheus names, on a listener of their own"),
    spec("PROMETHEUS_ADDR", "prometheus-addr", Some(":9090"), "Listen address of the reference's Prometheus metrics (:PORT for every address)"),
    spec("PROMETHEUS_PATH", "prometheus-path", Some("/metrics"), "Path of the reference's Prometheus metrics"),
    boolean("USE_STATSD", "use-statsd", "Send the reference's statsd counters (default false: Prometheus is built in at /metrics)"),
    spec("STATSD_HOST", "statsd-host", Some("localhost"), "Statsd host"),
    spec("STATSD_PORT", "statsd-port", Some("8125"), "Statsd UDP port"),
    spec("STATS_FLUSH_INTERVAL", "stats-flush-interval", Some("10s"), "How often the statsd counters are sent"),
    boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "stop-cache-key-increment-when-overlimit", "When any descriptor of a request goes over, do not count the others"),
    boolean("MERGE_DOMAIN_CONFIG", "merge-domain-config", "Merge files that share a domain instead of rejecting them"),
    spec("DEFAULT_ALGORITHM", "default-algorithm", Some("sliding_window"), "Algorithm of the limits that name none: sliding_window, or fixed_window (envoyproxy/ratelimit's windows, for every rule at once)"),
    boolean("TRACING_ENABLED", "tracing-enabled", "Export a span per ShouldRateLimit over OTLP, continuing Envoy's trace (W3C or B3 headers)"),
    spec("TRACING_EXPORTER_PROTOCOL", "tracing-exporter-protocol", Some("http"), "OTLP protocol: http (protobuf, port 4318) or grpc (port 4317); OTLP metrics use it too"),
    spec("TRACING_SERVICE_NAME", "tracing-service-name", Some("RateLimit"), "service.name of exported spans and OTLP metrics"),
    spec("TRACING_SERVICE_NAMESPACE", "tracing-service-namespace", Some(""), "service.namespace of exported spans and OTLP metrics (empty: none)"),
    spec("TRACING_SERVICE_INSTANCE_ID", "tracing-service-instance-id", None, "service.instance.id of exported spans and OTLP metrics (unset: a random UUID)"),
    spec("TRACING_SAMPLING_RATE", "tracing-sampling-rate", Some("1"), "Share of requests without a sampled parent that are traced (0 to 1); a sampled parent is always followed"),
    spec("OTEL_EXPORTER_OTLP_ENDPOINT", "otlp-endpoint", None, "OTLP collector base URL (http://): http appends /v1/traces or /v1/metrics (unset: localhost:4318, or :4317 for grpc)"),
    spec("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otlp-traces-endpoint", None, "OTLP endpoint of spans, used as is (overrides OTEL_EXPORTER_OTLP_ENDPOINT)"),
    spec("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "otlp-metrics-endpoint", None, "OTLP endpoint of metrics, used as is; setting it turns OTLP metrics on"),
    spec("OTEL_METRICS_EXPORTER", "otel-metrics-exporter", Some("none"), "otlp: also push the metrics of /metrics over OTLP (every OTEL_METRIC_EXPORT_INTERVAL ms, default 60000); none or prometheus: only /metrics"),
    spec("NEAR_LIMIT_RATIO", "near-limit-ratio", Some("0.8"), "Share of the limit (0 to 1) past which hits count as near_limit in metrics"),
    spec("EXACT_BELOW", "exact-below", Some("16"), "Global mode: a rule whose every limit holds fewer hits than this is decided as exact: true decides it (0: never)"),
    Spec { shape: Shape::List, secret: true, ..spec("REDIS_URL", "redis-url", None, "Redis URL(s) for global mode: repeat the flag or separate with commas") },
    spec("REDIS_TYPE", "redis-type", Some("SINGLE"), "Redis deployment: SINGLE, CLUSTER or SENTINEL (REDIS_URL is then <master name>,<sentinel host:port>,...)"),
    Spec { secret: true, ..spec("REDIS_AUTH", "redis-auth", None, "Redis password or user:pass") },
    boolean("REDIS_TLS", "redis-tls", "Use TLS to Redis (rediss://); the server is verified against the system's roots (or the bundle named by SSL_CERT_FILE), or REDIS_TLS_CACERT"),
    spec("REDIS_TLS_CLIENT_CERT", "redis-tls-client-cert", None, "Client certificate chain (PEM file) presented to Redis over TLS (mTLS), per-second Redis included; with REDIS_TLS_CLIENT_KEY"),
    spec("REDIS_TLS_CLIENT_KEY", "redis-tls-client-key", None, "Private key (PEM file) of REDIS_TLS_CLIENT_CERT"),
    spec("REDIS_TLS_CACERT", "redis-tls-cacert", None, "CA bundle (PEM file) Redis's TLS certificate is verified against, instead of the system's roots"),
    boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "redis-tls-skip-hostname-verification", "Verify Redis's certificate chain but not that it names the host dialled (not with SENTINEL)"),
    spec("CACHE_KEY_PREFIX", "cache-key-prefix", Some(""), "Prefix of every Redis key"),
    spec("REDIS_POOL_SIZE", "redis-pool-size", Some("4"), "Connections per Redis shard (at least 1)"),
    spec("REDIS_TIMEOUT", "redis-timeout", Some("100ms"), "Timeout of one Redis call (a sync round trip)"),
    Spec { secret: true, ..spec("REDIS_SENTINEL_AUTH", "redis-sentinel-auth", None, "Password (or user:pass) of the sentinels with REDIS_TYPE=SENTINEL; REDIS_AUTH is the master's") },
    boolean("REDIS_PERSECOND", "redis-persecond", "Keep the counters of limits whose unit is second in a Redis of their own (REDIS_PERSECOND_URL)"),
    Spec { shape: Shape::List, secret: true, ..spec("REDIS_PERSECOND_URL", "redis-persecond-url", None, "Redis URL(s) of the per-second limits, as REDIS_URL") },
    spec("REDIS_PERSECOND_TYPE", "redis-persecond-type", Some("SINGLE"), "The per-second Redis's deployment, as REDIS_TYPE"),
    Spec { secret: true, ..spec("REDIS_PERSECOND_AUTH", "redis-persecond-auth", None, "The per-second Redis's password or user:pass") },
    boolean("REDIS_PERSECOND_TLS", "redis-persecond-tls", "Use TLS to the per-second Redis"),
    spec("REDIS_PERSECOND_POOL_SIZE", "redis-persecond-pool-size", Some("4"), "Connections per per-second Redis shard (at least 1)"),
    Spec { secret: true, ..spec("REDIS_PERSECOND_SENTINEL_AUTH", "redis-persecond-sentinel-auth", None, "Password (or user:pass) of the per-second Redis's sentinels") },
    spec("REDIS_PERSECOND_TIMEOUT", "redis-persecond-timeout", None, "Timeout of one call to the per-second Redis (unset: REDIS_TIMEOUT)"),
    spec("SYNC_TICK", "sync-tick", Some("1s"), "Tick of the sync tasks: how often each shard sends one round trip"),
    spec("SYNC_INTERVAL", "sync-interval", Some("2s"), "Base sync interval: Normal entities sync this often, Low 4x, Idle 8x, Hot every tick"),
    spec("SYNC_MAX_QUEUED", "sync-max-queued", Some("1000000"), "Most entities waiting to sync (bounds memory while Redis is down)"),
    spec("RESET_LOG_LENGTH", "reset-log-length", Some("10000"), "Most entries each Redis shard's reset log keeps (1 to 1000000): the resets (POST /reset) a replica cut off from Redis can miss and still clear on reconnecting"),
    spec("SYNC_JOIN_TIMEOUT", "sync-join-timeout", Some("2s"), "Longest a replica waits at start to join the fleet (Redis registers it, then the running replicas count it: one SYNC_TICK plus REDIS_TIMEOUT at most) before it reports ready anyway, deciding locally until Redis answers; keep it above SYNC_TICK + REDIS_TIMEOUT. 0: ready at once"),
    spec("CACHE_MAX_ENTRIES", "cache-max-entries", Some("1000000"), "Most entities (rule + descriptor values) kept in memory (at least 1)"),
    spec("CACHE_IDLE_TIMEOUT", "cache-idle-timeout", Some("60s"), "Drop an entity unused this long once it holds nothing (its windows passed, its buckets full)"),
    spec("CACHE_TTL", "cache-ttl", None, "Drop an entity unused this long even when it still counts; its counts go to the sketch (unset: never)"),
    spec("MAX_DESCRIPTORS", "max-descriptors", Some("64"), "Most descriptors in one request"),
    spec("MAX_DESCRIPTOR_ENTRIES", "max-descriptor-entries", Some("32"), "Most entries in one descriptor"),
    spec("MAX_VALUE_BYTES", "max-value-bytes", Some("4096"), "Longest entry key or value, in bytes"),
    spec("METRICS_MAX_KEY_BYTES", "metrics-max-key-bytes", Some("512"), "Longest metric key made from client input (limit overrides, detailed_metric/value_to_metric values), in bytes (at least 64); a longer one keeps its start and a hash of the whole"),
    Spec { default: Some("true"), ..boolean("METRICS_OVERRIDE_SERIES", "metrics-override-series", "Each of a rule's overrides has a metric series of its own (as a descriptor for that value would); false: its hits count in the rule's series") },
    spec("DECISION_LOG_RATE", "decision-log-rate", Some("0"), "Decision lines logged at info, a second at most: a sample of the descriptors decided (domain, rule, count, limit, code) safe to leave on; 0: none (LOG_LEVEL=debug logs every decision)"),
    boolean("DECISION_LOG_VALUES", "decision-log-values", "Decision lines name the descriptors' values too, not only their keys (values are often secrets or personal data)"),
    spec("METRICS_MAX_CLIENT_SERIES", "metrics-max-client-series", Some("10000"), "Most metric series made from client input; past it their hits are counted under the rule's own series (limit overrides: <domain>.override)"),
    Spec { shape: Shape::Hidden, ..spec("SLUICE_CLOCK_SKEW", "clock-skew", None, "Testing aid: pretend this machine's clock is off by this much (e.g. 30s, -5s); in global mode the offset measured from Redis TIME corrects it") },
    Spec { default: Some("true"), ..boolean("RLQS_ENABLED", "rlqs-enabled", "Serve Envoy's rate-limit quota service (StreamRateLimitQuotas) on the gRPC port") },
    spec("RLQS_UNKNOWN_BUCKETS", "rlqs-unknown-buckets", Some("ALLOW_ALL"), "What a quota bucket no rule matches gets: ALLOW_ALL or DENY_ALL, or per domain as domain=ACTION,... (*=ACTION for the rest)"),
    spec("RLQS_ASSIGNMENT_TTL", "rlqs-assignment-ttl", Some("15s"), "How long Envoy keeps a quota assignment unless renewed (whole seconds, at least 1s): what it enforces when it loses sluice"),
    spec("RLQS_ABANDON_AFTER", "rlqs-abandon-after", Some("10m"), "A quota bucket without a request for this long is abandoned (Envoy drops it; its next request starts it again)"),
    spec("RLQS_MAX_STREAMS", "rlqs-max-streams", Some("4096"), "Most quota streams open at once; past it a stream is refused RESOURCE_EXHAUSTED"),
    spec("RLQS_MAX_BUCKETS_PER_STREAM", "rlqs-max-buckets-per-stream", Some("10000"), "Most buckets one quota stream may have; past it a new bucket gets no assignment (Envoy's no_assignment_behavior applies)"),
    spec("RLQS_MAX_BUCKETS", "rlqs-max-buckets", Some("200000"), "Most quota buckets tracked, every stream together; past it a new bucket gets no assignment"),
    spec("RLQS_MAX_BUCKET_ID_BYTES", "rlqs-max-bucket-id-bytes", Some("1024"), "Most bytes of one quota bucket id's keys and values together; a report with a longer id ends its stream INVALID_ARGUMENT"),
    spec("RLQS_MAX_TRACKED_ID_BYTES", "rlqs-max-tracked-id-bytes", Some("67108864"), "Most bytes of the keys and values of the quota buckets' ids tracked, every stream together; past it a new bucket gets no assignment"),
    spec("ADMIN_TOKEN_FILE", "admin-token-file", None, "A file holding the token that POST /reset and GET /top require (Authorization: Bearer <token>), read at start; unset: both are refused"),
    boolean("ADMIN_OPEN_READS", "admin-open-reads", "The admin reads that show descriptor values (GET /top, the status page's top keys) answer without the admin token (only on a trusted network); POST /reset still requires it"),
    spec("SHUTDOWN_GRACE", "shutdown-grace", Some("20s"), "Time given to in-flight calls on SIGTERM before exiting anyway"),
    spec("RELOAD_DEBOUNCE", "reload-debounce", Some("200ms"), "Quiet time after a rules change before reloading"),
];

/// The row of `env`, if it is a setting of `serve`.
pub fn spec_of(env: &str) -> Option<&'static Spec> {
    SERVE.iter().find(|s| s.env == env)
}

impl Spec {
    fn arg(&self) -> Arg {
        // The variable and default go in the help text by hand: clap's own `env` would read
        // the process environment and print its values (REDIS_URL's password included).
        let default = match self.default {
            Some("") => " [default: \"\"]".to_string(),
            Some(d) => format!(" [default: {d}]"),
            None => String::new(),
        };
        let arg = Arg::new(self.env)
            .long(self.flag)
            .value_name("VALUE")
            .help(format!("{} [env: {}]{default}", self.help, self.env));
        match self.shape {
            Shape::Value => arg.action(ArgAction::Set),
            Shape::Bool => arg
                .action(ArgAction::Set)
                .num_args(0..=1)
                .default_missing_value("true"),
            Shape::List => arg.action(ArgAction::Append),
            Shape::Hidden => arg
                .action(ArgAction::Set)
                .hide(true)
                .allow_hyphen_values(true),
        }
    }
}

/// Flags of `sluice serve` as given, keyed by setting (variable) name; unparsed, so that
/// `Settings::resolve` can report every bad value, wherever it came from, in one run.
#[derive(Clone, Default)]
pub struct ServeArgs {
    flags: BTreeMap<&'static str, String>,
}

impl ServeArgs {
    /// Sets the flag of setting `env`, as `--flag value` would (repeated list flags join
    /// with commas). For embedding and tests.
    ///
    /// # Panics
    /// When `env` is not a setting of `serve` (a programming error).
    pub fn with(mut self, env: &str, value: impl Into<String>) -> Self {
        let spec = spec_of(env).unwrap_or_else(|| panic!("{env} is not a serve setting"));
        self.flags.insert(spec.env, value.into());
        self
    }

    /// The flag's value of setting `env`, if the flag was given.
    pub fn flag(&self, env: &str) -> Option<&str> {
        self.flags.get(env).map(String::as_str)
    }
}

impl std::fmt::Debug for ServeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.flags.iter().map(|(k, v)| {
            let secret = spec_of(k).is_some_and(|s| s.secret);
            (k, if secret { "<redacted>" } else { v.as_str() })
        });
        f.debug_map().entries(shown).finish()
    }
}

impl FromArgMatches for ServeArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ServeArgs::default();
        args.update_from_arg_matches(m)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for s in SERVE {
            if m.value_source(s.env) != Some(ValueSource::CommandLine) {
                continue;
            }
            if let Some(values) = m.get_many::<String>(s.env) {
                let joined = values.map(String::as_str).collect::<Vec<_>>().join(",");
                self.flags.insert(s.env, joined);
            }
        }
        Ok(())
    }
}

impl Args for ServeArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.args(SERVE.iter().map(Spec::arg))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}
