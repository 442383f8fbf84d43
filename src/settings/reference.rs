//! Every environment variable envoyproxy/ratelimit reads, and what sluice does with each:
//! the table behind docs/settings.md's "Environment variables of envoyproxy/ratelimit", and the
//! start-up check that warns about the ones sluice ignores and refuses the values it cannot
//! honour. A test walks that table against this one, so neither can rot.

use super::source::SettingsSource;
use super::SettingsError;

/// What sluice does with one of the reference's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Read by sluice with the reference's meaning (a flag of its own too).
    Same,
    /// Read by sluice; the note says how it differs.
    Mapped(&'static str),
    /// Accepted and ignored, with a start-up warning saying why, unless its value is one of
    /// the listed ones (those mean what sluice does anyway).
    Ignored(&'static str, &'static [&'static str]),
    /// Refused at start with this reason unless its value is one of the listed ones.
    Refused(&'static str, &'static [&'static str]),
}

use Treatment::{Ignored, Mapped, Refused, Same};

const NO_DEBUG: &str =
    "no debug port: /rlconfig, /metrics and the health checks are on the HTTP port";
const XDS_BACKOFF: &str = "reconnection waits CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, doubled per failed attempt up to XDS_CLIENT_BACKOFF_MAX_INTERVAL, without jitter";
const METRICS: &str = "metrics are served in Prometheus format at /metrics on the HTTP port (and, with USE_STATSD, the reference's statsd counters); DogStatsD, tags and a mapping file of one's own are not supported yet";
const NO_MEMCACHE: &str = "memcache is not a backend of sluice (BACKEND_TYPE is refused)";
const PIPELINE: &str = "each tick's sync is one pipelined call per shard";
const FALSE: &[&str] = &["false", "0", "no", "off", "f", "n"];

/// The reference's variables (its `settings.go`, plus the OpenTelemetry endpoint its tracer
/// reads), in its order.
pub const REFERENCE_ENV: &[(&str, Treatment)] = &[
    ("HOST", Same),
    ("PORT", Same),
    ("DEBUG_HOST", Ignored(NO_DEBUG, &[])),
    ("DEBUG_PORT", Ignored(NO_DEBUG, &[])),
    ("GRPC_UDS", Refused("gRPC on a unix socket is not supported: use GRPC_HOST/GRPC_PORT", &[])),
    ("GRPC_HOST", Same),
    ("GRPC_PORT", Same),
    ("GRPC_MAX_CONNECTION_AGE", Ignored("connections are not aged out", &[])),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Ignored("connections are not aged out", &[])),
    ("GRPC_SERVER_USE_TLS", Same),
    ("GRPC_SERVER_TLS_CERT", Mapped("re-read when the file changes (Kubernetes Secret rotation)")),
    ("GRPC_SERVER_TLS_KEY", Mapped("re-read with the certificate")),
    ("GRPC_CLIENT_TLS_CACERT", Same),
    ("GRPC_CLIENT_TLS_SAN", Mapped("a DNS (wildcards match) or IP name; refused without GRPC_CLIENT_TLS_CACERT")),
    ("LOG_LEVEL", Mapped("default info (the reference's: WARN); also takes an env-filter directive")),
    ("LOG_FORMAT", Same),
    ("CONFIG_TYPE", Same),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Mapped("xDS: sluice serves at once either way (nothing is limited until the first rule set arrives) and is not ready until then; set, it is ready at once. The reference does not serve until then")),
    ("CONFIG_GRPC_XDS_NODE_ID", Same),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Mapped("key=value pairs, sent as string values; a pair without = is dropped with a warning (the reference drops it silently)")),
    ("CONFIG_GRPC_XDS_SERVER_URL", Same),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Mapped("the first wait before reconnecting, doubled per failed attempt up to XDS_CLIENT_BACKOFF_MAX_INTERVAL")),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Same),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Same),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Same),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Same),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Same),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Same),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Ignored(XDS_BACKOFF, &[])),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Mapped("the longest wait between reconnection attempts (default 60s)")),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Ignored(XDS_BACKOFF, &[])),
    ("XDS_CLIENT_BACKOFF_JITTER", Ignored(XDS_BACKOFF, &[])),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Same),
    ("USE_DOG_STATSD", Ignored(METRICS, FALSE)),
    ("USE_DOG_STATSD_MOGRIFIERS", Ignored(METRICS, &[])),
    ("USE_STATSD", Mapped("default false (the reference's: true): Prometheus is built in at /metrics. Sends the per-rule counters, ShouldRateLimit.total_requests and response_time, the error and config load counters")),
    ("STATSD_HOST", Same),
    ("STATSD_PORT", Same),
    ("EXTRA_TAGS", Ignored(METRICS, &[])),
    ("STATS_FLUSH_INTERVAL", Same),
    ("DISABLE_STATS", Ignored(METRICS, FALSE)),
    ("USE_PROMETHEUS", Same),
    ("PROMETHEUS_ADDR", Same),
    ("PROMETHEUS_PATH", Same),
    ("PROMETHEUS_MAPPER_YAML", Ignored(METRICS, &[])),
    ("RUNTIME_ROOT", Same),
    ("RUNTIME_SUBDIRECTORY", Same),
    ("RUNTIME_APPDIRECTORY", Same),
    ("RUNTIME_IGNOREDOTFILES", Ignored("dot files are always skipped (the ConfigMap's ..data swap among them)", &["true", "1", "yes", "on", "t", "y"])),
    ("RUNTIME_WATCH_ROOT", Ignored("the rules directory is watched, the ConfigMap swap included, whatever its value", &[])),
    ("EXPIRATION_JITTER_MAX_SECONDS", Ignored("keys expire with their windows; replicas write them at different times anyway", &[])),
    ("LOCAL_CACHE_SIZE_IN_BYTES", Ignored("every decision is made from memory; CACHE_MAX_ENTRIES bounds the entity table", &[])),
    ("NEAR_LIMIT_RATIO", Same),
    ("CACHE_KEY_PREFIX", Same),
    ("BACKEND_TYPE", Refused("only redis is supported: counters live in memory and sync through Redis", &["redis"])),
    ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Same),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Same),
    ("LIMIT_LIMIT_HEADER", Same),
    ("LIMIT_REMAINING_HEADER", Same),
    ("LIMIT_RESET_HEADER", Same),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Mapped("xDS: ready only while the rules in force have a domain. With files it changes nothing: sluice does not start without valid rules")),
    ("REDIS_SOCKET_TYPE", Ignored("the URL's form says it: host:port or redis:// for TCP, unix:// for a socket", &[])),
    ("REDIS_TYPE", Mapped("SINGLE, CLUSTER or SENTINEL (REDIS_URL: <master name>,<sentinel>,...; connections follow the master the sentinels promote); several comma-separated SINGLE URLs are shards")),
    ("REDIS_URL", Mapped("set: global mode (the fleet syncs through it); unset: local mode, where the reference cannot start")),
    ("REDIS_POOL_SIZE", Same),
    ("REDIS_AUTH", Same),
    ("REDIS_TLS", Same),
    ("REDIS_TLS_CLIENT_CERT", Mapped("read at start (a missing or bad file stops it); presented to every Redis over TLS, the per-second one's included, as in the reference")),
    ("REDIS_TLS_CLIENT_KEY", Mapped("read at start with REDIS_TLS_CLIENT_CERT (both or neither)")),
    ("REDIS_TLS_CACERT", Mapped("read at start; replaces the system's roots for every Redis over TLS, the per-second one's included")),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Mapped("the chain is still verified; refused with REDIS_TYPE=SENTINEL over TLS (the master's name is always checked)")),
    ("REDIS_PIPELINE_WINDOW", Ignored(PIPELINE, &[])),
    ("REDIS_PIPELINE_LIMIT", Ignored(PIPELINE, &[])),
    ("REDIS_USE_EXPLICIT_PIPELINE", Ignored(PIPELINE, &[])),
    ("REDIS_PERSECOND", Mapped("true: rules whose limits all have unit second keep their counters (synced and exact) in the Redis of REDIS_PERSECOND_URL; a rule mixing seconds with longer units stays in REDIS_URL's")),
    ("REDIS_PERSECOND_SOCKET_TYPE", Ignored("the URL's form says it: host:port or redis:// for TCP, unix:// for a socket", &[])),
    ("REDIS_PERSECOND_TYPE", Mapped("SINGLE, CLUSTER or SENTINEL, as REDIS_TYPE (with REDIS_PERSECOND_SENTINEL_AUTH for the sentinels)")),
    ("REDIS_PERSECOND_URL", Mapped("required with REDIS_PERSECOND=true; in REDIS_URL's forms")),
    ("REDIS_PERSECOND_POOL_SIZE", Same),
    ("REDIS_PERSECOND_AUTH", Same),
    ("REDIS_PERSECOND_TLS", Same),
    ("REDIS_SENTINEL_AUTH", Same),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Same),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", Ignored(PIPELINE, &[])),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", Ignored(PIPELINE, &[])),
    ("REDIS_PERSECOND_USE_EXPLICIT_PIPELINE", Ignored(PIPELINE, &[])),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Ignored("/readyz reports each shard's health; decisions go on from memory while Redis is down", &[])),
    ("REDIS_TIMEOUT", Same),
    ("REDIS_PERSECOND_TIMEOUT", Mapped("default: REDIS_TIMEOUT's value")),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", Ignored("the sync never waits on the pool from the request path", &[])),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", Ignored("the sync never waits on the pool from the request path", &[])),
    ("MEMCACHE_HOST_PORT", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_MAX_IDLE_CONNS", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_SRV", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_SRV_REFRESH", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_TLS", Ignored(NO_MEMCACHE, FALSE)),
    ("MEMCACHE_TLS_CLIENT_CERT", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_TLS_CLIENT_KEY", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_TLS_CACERT", Ignored(NO_MEMCACHE, &[])),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Ignored(NO_MEMCACHE, FALSE)),
    ("SHADOW_MODE", Same),
    ("RESPONSE_DYNAMIC_METADATA", Same),
    ("MERGE_DOMAIN_CONFIG", Same),
    ("TRACING_ENABLED", Same),
    ("TRACING_SERVICE_NAME", Same),
    ("TRACING_SERVICE_NAMESPACE", Same),
    ("TRACING_SERVICE_INSTANCE_ID", Same),
    ("TRACING_EXPORTER_PROTOCOL", Mapped("http or grpc, as the reference; OTLP metrics (OTEL_METRICS_EXPORTER=otlp) use it too")),
    ("TRACING_SAMPLING_RATE", Same),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", Mapped("plain http:// only (https is refused: no TLS to the collector yet); also the base of OTLP metrics when they are on")),
];

/// The warnings (ignored variables that are set) and errors (refused values) of `env`.
pub(super) fn check(env: &dyn SettingsSource) -> (Vec<String>, Vec<SettingsError>) {
    let (mut warnings, mut errors) = (Vec::new(), Vec::new());
    for &(name, treatment) in REFERENCE_ENV {
        let Some(value) = env.get(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        let fine = |ok: &[&str]| ok.iter().any(|o| o.eq_ignore_ascii_case(value.trim()));
        match treatment {
            Ignored(why, ok) if !fine(ok) => {
                warnings.push(format!("{name} is set but has no effect in sluice: {why}"));
            }
            Refused(why, ok) if !fine(ok) => errors.push(SettingsError {
                setting: name,
                message: format!("'{}' is refused: {why}", shown(name, &value)),
            }),
            _ => {}
        }
    }
    (warnings, errors)
}

/// A value as an error may show it: never for a variable that may hold a secret.
fn shown(name: &str, value: &str) -> String {
    if name.contains("AUTH") || name.contains("KEY") {
        "<redacted>".into()
    } else {
        value.trim().to_string()
    }
}
