//! Process settings: every setting has a flag and an environment variable, with
//! envoyproxy/ratelimit's variable names and defaults where the meaning is shared. `Settings`
//! is the resolved form `lib::run` takes; [`Settings::resolve`] parses and checks every value
//! from the flags and an injected environment ([`SettingsSource`]) and reports every bad
//! setting at once.
//!
//! Files: `flags.rs` (`serve`'s settings table and its clap arguments), `source.rs` (the
//! environment source, lookup and value parsers), this file (the resolved settings, the
//! service's behaviour and Redis), and per area `listen.rs` (gRPC and HTTP listeners and
//! bounds), `rules.rs` (rules files, xDS), `telemetry.rs` (metrics, traces, logs) and
//! `reference.rs` (envoyproxy/ratelimit's variables); the tests in `tests/`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::core::table::CacheSettings;
use crate::core::SyncPolicy;
use crate::global::redis::{normalize_url, RedisOptions, RedisTls, SentinelMaster};
use crate::global::sync::reset_log::{DEFAULT_RESET_LOG_LENGTH, MAX_RESET_LOG_LENGTH};
use crate::global::SyncSettings;
pub use crate::global::{PerSecondRedis, RedisSettings};
use crate::rls::{HeaderFormat, HeaderNames, Options};
use crate::rules::CompileOptions;
use crate::server::grpc_conn::GrpcLimits;
use crate::server::tls::{self, GrpcTls};
use crate::sources::xds::XdsSettings;
use crate::telemetry::otel::OtlpSettings;
use crate::telemetry::prometheus_ref::PrometheusSettings;
use crate::telemetry::statsd::StatsdSettings;
use crate::telemetry::{SeriesBounds, MIN_KEY_BYTES};

mod flags;
mod listen;
mod quota;
pub mod reference;
mod rules;
mod source;
mod telemetry;

pub use flags::{spec_of, ServeArgs, Shape, Spec, SERVE};
pub use source::{NoEnv, SettingsSource};

use source::{
    at_least_one, boolean, duration, number, one_of, positive_duration, ratio, signed_millis,
    Values,
};

/// Process settings resolved from [`ServeArgs`] and the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rules file or directory (unused when the rules come over xDS).
    pub config_path: PathBuf,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the rules come from this management server, not files.
    pub xds: Option<XdsSettings>,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// TLS on the gRPC listener, when on (the HTTP admin port stays plain).
    pub grpc_tls: Option<GrpcTls>,
    /// Bounds on the gRPC port: connections, streams, requests in flight, time.
    pub grpc_limits: GrpcLimits,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Time an HTTP client has to send a request's headers.
    pub http_header_read_timeout: Duration,
    /// An idle HTTP keep-alive connection is closed after this long.
    pub http_idle_timeout: Duration,
    /// Most HTTP connections served at once.
    pub http_max_connections: usize,
    /// How the rules are read: files sharing a domain merged, the default algorithm.
    pub rules: CompileOptions,
    /// Service behaviour.
    pub options: Options,
    /// Log level.
    pub log_level: String,
    /// Log format.
    pub log_format: String,
    /// Drain time on shutdown.
    pub shutdown_grace: Duration,
    /// Reload debounce.
    pub reload_debounce: Duration,
    /// Global mode: the shared Redis, if configured.
    pub redis: Option<RedisSettings>,
    /// `REDIS_PERSECOND`: a Redis of their own for limits whose unit is second (global mode).
    pub redis_per_second: Option<PerSecondRedis>,
    /// Sync cadence, timeouts and bounds (global mode).
    pub sync: SyncSettings,
    /// Most entities waiting to sync.
    pub sync_max_queued: usize,
    /// `SYNC_JOIN_TIMEOUT`: how long the start waits for Redis to register this replica in
    /// the fleet before it reports ready (zero: no join, ready at once).
    pub sync_join_timeout: Duration,
    /// Testing aid: milliseconds added to the system clock before any correction.
    pub clock_skew_ms: i64,
    /// `USE_PROMETHEUS`: where the reference's Prometheus names are served.
    pub prometheus: Option<PrometheusSettings>,
    /// `USE_STATSD`: where and how often the reference's statsd counters go.
    pub statsd: Option<StatsdSettings>,
    /// `TRACING_*` and OTLP metrics: what goes to an OpenTelemetry collector.
    pub otlp: OtlpSettings,
    /// The quota service (RLQS): its bounds; `None` when `RLQS_ENABLED=false`.
    pub rlqs: Option<crate::rlqs::Config>,
    /// `ADMIN_TOKEN_FILE`: the token `POST /reset` requires; `None` refuses it.
    pub admin_token: Option<crate::server::admin_token::AdminToken>,
    /// `ADMIN_OPEN_READS`: `GET /top` answers without the token (`/reset` still needs it).
    pub admin_open_reads: bool,
    /// envoyproxy/ratelimit variables that are set but mean nothing here, one line each
    /// ([`reference`]): logged at start.
    pub warnings: Vec<String>,
}

/// One bad setting: the variable (with its flag, when it has one of its own) and what is
/// wrong, quoting the bad value unless it is a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}{}: {message}", flag_hint(setting))]
pub struct SettingsError {
    /// The variable, or variables (`GRPC_HOST/GRPC_PORT`) when the problem is their mix.
    pub setting: &'static str,
    /// What is wrong.
    pub message: String,
}

fn flag_hint(setting: &str) -> String {
    spec_of(setting)
        .map(|s| format!(" (--{})", s.flag))
        .unwrap_or_default()
}

impl Settings {
    /// Resolves flags, then the variables of `env`, then defaults into settings.
    ///
    /// # Errors
    /// Every bad setting, at once: unparsable values, values out of range, unknown choices.
    pub fn resolve(
        args: &ServeArgs,
        env: &dyn SettingsSource,
    ) -> Result<Settings, Vec<SettingsError>> {
        let mut v = Values::new(args, env);
        let listeners = listen::listeners(&mut v);
        let grpc_tls = listen::grpc_tls(&mut v);
        let (config_path, rules, reload_debounce) = rules::files(&mut v);
        let options = options(&mut v);
        let redis_tls = redis_tls(&mut v);
        let redis = redis(&mut v, &MAIN, &redis_tls);
        let (sync, sync_max_queued) = sync(&mut v);
        let sync_join_timeout = v.or("SYNC_JOIN_TIMEOUT", Duration::ZERO, duration);
        let redis_per_second = per_second(&mut v, redis.is_some(), sync.timeout, &redis_tls);
        let log_level = v.or("LOG_LEVEL", String::new(), telemetry::log_level);
        let log_format = v.or("LOG_FORMAT", "text", one_of(&["text", "json"]));
        let shutdown_grace = v.or("SHUTDOWN_GRACE", Duration::ZERO, duration);
        let clock_skew_ms = v.parse("SLUICE_CLOCK_SKEW", signed_millis).unwrap_or(0);
        let statsd = telemetry::statsd(&mut v);
        let prometheus = telemetry::prometheus(&mut v);
        let mut warnings = Vec::new();
        let xds = rules::xds(&mut v, &mut warnings);
        let otlp = telemetry::otlp(&mut v);
        let rlqs = quota::rlqs(&mut v);
        let admin_token = admin_token(&mut v);
        let admin_open_reads = v.or("ADMIN_OPEN_READS", false, boolean);
        let (reference_warnings, refused) = reference::check(env);
        warnings.extend(reference_warnings);
        v.errors.extend(refused);
        let (Some(grpc_addr), Some(http_addr), true) =
            (listeners.grpc, listeners.http, v.errors.is_empty())
        else {
            return Err(v.errors);
        };
        Ok(Settings {
            config_path,
            xds,
            grpc_addr,
            grpc_tls,
            grpc_limits: listeners.grpc_limits,
            http_addr,
            http_header_read_timeout: listeners.header_read_timeout,
            http_idle_timeout: listeners.idle_timeout,
            http_max_connections: listeners.max_connections,
            rules,
            options,
            log_level,
            log_format: log_format.to_string(),
            shutdown_grace,
            reload_debounce,
            redis,
            redis_per_second,
            sync,
            sync_max_queued,
            sync_join_timeout,
            clock_skew_ms,
            statsd,
            prometheus,
            otlp,
            rlqs,
            admin_token,
            admin_open_reads,
            warnings,
        })
    }

    /// Default settings on the given addresses, for embedding and tests: no environment is
    /// read.
    pub fn for_addrs(
        config_path: PathBuf,
        grpc_addr: SocketAddr,
        http_addr: SocketAddr,
    ) -> Settings {
        let mut s = Settings::resolve(&ServeArgs::default(), &NoEnv)
            .expect("the default settings are valid");
        s.config_path = config_path;
        s.grpc_addr = grpc_addr;
        s.http_addr = http_addr;
        s
    }

    /// Global mode's settings, when a Redis is set (`REDIS_URL`): local mode otherwise.
    pub fn global(&self) -> Option<crate::global::Config> {
        Some(crate::global::Config::new(
            self.redis.clone()?,
            self.redis_per_second.clone(),
            self.sync,
            self.sync_max_queued,
            self.sync_join_timeout,
        ))
    }
}

/// The service's behaviour: modes, response headers, request bounds and the entity table.
fn options(v: &mut Values<'_>) -> Options {
    let headers = v
        .or("LIMIT_RESPONSE_HEADERS_ENABLED", false, boolean)
        .then(|| HeaderNames {
            limit: v.text("LIMIT_LIMIT_HEADER"),
            remaining: v.text("LIMIT_REMAINING_HEADER"),
            reset: v.text("LIMIT_RESET_HEADER"),
        });
    Options {
        shadow_mode: v.or("SHADOW_MODE", false, boolean),
        quota_mode: v.or("QUOTA_MODE", false, boolean),
        response_headers: headers,
        header_format: match v.or(
            "LIMIT_RESPONSE_HEADERS_FORMAT",
            "reference",
            one_of(&["reference", "ietf"]),
        ) {
            "ietf" => HeaderFormat::Ietf,
            _ => HeaderFormat::Reference,
        },
        problem_body: v.or("LIMIT_RESPONSE_BODY", "none", one_of(&["none", "problem"]))
            == "problem",
        dynamic_metadata: v.or("RESPONSE_DYNAMIC_METADATA", false, boolean),
        rule_metadata: v.or("RESPONSE_RULE_METADATA", false, boolean),
        stop_increment_when_over_limit: v.or(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
            false,
            boolean,
        ),
        near_limit_ratio: v.or("NEAR_LIMIT_RATIO", 0.8, ratio),
        exact_below: v.or("EXACT_BELOW", crate::rls::EXACT_BELOW, number),
        max_descriptors: v.or("MAX_DESCRIPTORS", 1, at_least_one),
        max_entries: v.or("MAX_DESCRIPTOR_ENTRIES", 1, at_least_one),
        max_value_bytes: v.or("MAX_VALUE_BYTES", 1, at_least_one),
        // 0 entries would evict every counter at once: limiting silently off.
        cache: CacheSettings {
            max_entries: v.or("CACHE_MAX_ENTRIES", 1, at_least_one),
            idle_timeout: v.or("CACHE_IDLE_TIMEOUT", Duration::ZERO, duration),
            ttl: v.parse("CACHE_TTL", duration),
        },
        metric_series: SeriesBounds {
            max_key_bytes: v.or(
                "METRICS_MAX_KEY_BYTES",
                MIN_KEY_BYTES,
                telemetry::at_least_key_bytes,
            ),
            max_client_series: v.or("METRICS_MAX_CLIENT_SERIES", 0, number),
        },
        override_series: v.or("METRICS_OVERRIDE_SERIES", true, boolean),
        decision_log_rate: v.or("DECISION_LOG_RATE", 0, number),
        decision_log_values: v.or("DECISION_LOG_VALUES", false, boolean),
    }
}

/// The variables of one Redis: the main one's (`REDIS_*`) or the per-second one's
/// (`REDIS_PERSECOND_*`), which the reference reads alike.
struct RedisVars {
    url: &'static str,
    kind: &'static str,
    auth: &'static str,
    tls: &'static str,
    pool_size: &'static str,
    sentinel_auth: &'static str,
}

const MAIN: RedisVars = RedisVars {
    url: "REDIS_URL",
    kind: "REDIS_TYPE",
    auth: "REDIS_AUTH",
    tls: "REDIS_TLS",
    pool_size: "REDIS_POOL_SIZE",
    sentinel_auth: "REDIS_SENTINEL_AUTH",
};

const PER_SECOND: RedisVars = RedisVars {
    url: "REDIS_PERSECOND_URL",
    kind: "REDIS_PERSECOND_TYPE",
    auth: "REDIS_PERSECOND_AUTH",
    tls: "REDIS_PERSECOND_TLS",
    pool_size: "REDIS_PERSECOND_POOL_SIZE",
    sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
};

/// A Redis, when its URL variable names at least one server. With `SENTINEL` the URL is the
/// reference's `<master name>,<sentinel>,<sentinel>...`; the sentinels take the sentinel
/// auth and the master the plain one, and TLS applies to both (as the reference dials them).
fn redis(v: &mut Values<'_>, vars: &RedisVars, tls_files: &RedisTls) -> Option<RedisSettings> {
    let kind = v.or(
        vars.kind,
        "SINGLE",
        one_of(&["SINGLE", "CLUSTER", "SENTINEL"]),
    );
    let tls = v.or(vars.tls, false, boolean);
    let auth = v.raw(vars.auth);
    let sentinel_auth = v.raw(vars.sentinel_auth);
    let pool_size = v.or(vars.pool_size, 1, at_least_one);
    let prefix = v.text("CACHE_KEY_PREFIX");
    let raw = v.raw(vars.url).unwrap_or_default();
    let mut entries: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let sentinel = if kind == "SENTINEL" && !entries.is_empty() {
        let name = entries.remove(0);
        if entries.is_empty() || name.contains("://") {
            v.error(
                vars.url,
                "with SENTINEL, is <master name>,<sentinel host:port>,... (the master's name first, then at least one sentinel)",
            );
            return None;
        }
        if tls && tls_files.skip_hostname_verification {
            // The redis crate dials the master the sentinels name with the certificates but
            // always checks its name; skipping it only for the sentinels would be half a
            // setting.
            v.error(
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                format!("is not supported with {}=SENTINEL: the master's certificate must match the address the sentinels give", vars.kind),
            );
        }
        Some(SentinelMaster {
            name: name.to_string(),
            tls,
        })
    } else {
        None
    };
    // The sentinels answer to their own credentials; the master (through `options`) to auth.
    let url_auth = if sentinel.is_some() {
        sentinel_auth.as_deref()
    } else {
        auth.as_deref()
    };
    let mut urls = Vec::new();
    for u in entries {
        // normalize_url's message shows the URL redacted.
        match normalize_url(u, url_auth, tls) {
            Ok(n) => urls.push(n),
            Err(e) => v.error(vars.url, e.to_string()),
        }
    }
    if urls.is_empty() {
        return None;
    }
    Some(RedisSettings {
        urls,
        cluster: kind == "CLUSTER",
        sentinel,
        options: RedisOptions {
            auth,
            prefix,
            pool_size,
            tls: tls_files.clone(),
        },
    })
}

/// `ADMIN_TOKEN_FILE`, read here so that a missing or empty file stops the start naming it.
fn admin_token(v: &mut Values<'_>) -> Option<crate::server::admin_token::AdminToken> {
    let path = v.raw("ADMIN_TOKEN_FILE").filter(|s| !s.trim().is_empty())?;
    let path = PathBuf::from(path);
    match crate::server::admin_token::AdminToken::from_file(&path) {
        Ok(t) => Some(t),
        Err(e) => {
            v.error("ADMIN_TOKEN_FILE", e.to_string());
            None
        }
    }
}

/// `REDIS_TLS_CLIENT_CERT`/`_KEY`, `REDIS_TLS_CACERT` and
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: for every TLS connection to Redis, the per-second
/// one's included (the reference has no `REDIS_PERSECOND_TLS_*` files). The files are read
/// once here, in global mode, so that a missing or bad one stops the start naming it.
fn redis_tls(v: &mut Values<'_>) -> RedisTls {
    let path = |v: &Values<'_>, name| v.raw(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    let cert = path(v, "REDIS_TLS_CLIENT_CERT");
    let key = path(v, "REDIS_TLS_CLIENT_KEY");
    let ca = path(v, "REDIS_TLS_CACERT");
    let skip_hostname_verification = v.or("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false, boolean);
    // Local mode dials no Redis: its files are not read (nor can they stop the start).
    if v.raw("REDIS_URL").is_none_or(|u| u.trim().is_empty()) {
        return RedisTls::default();
    }
    let read = |v: &mut Values<'_>, name: &'static str, p: &PathBuf| match std::fs::read(p) {
        Ok(b) => Some(b),
        Err(e) => {
            v.error(name, format!("{}: {e}", p.display()));
            None
        }
    };
    let client_tls = match (&cert, &key) {
        (None, None) => None,
        (Some(cert), Some(key)) => match tls::load_certified_key(cert, key) {
            Ok(_) => Some(redis::ClientTlsConfig {
                client_cert: read(v, "REDIS_TLS_CLIENT_CERT", cert).unwrap_or_default(),
                client_key: read(v, "REDIS_TLS_CLIENT_KEY", key).unwrap_or_default(),
            }),
            Err(e) => {
                let name = match &e {
                    tls::TlsError::File { path, .. } if path == key => "REDIS_TLS_CLIENT_KEY",
                    _ => "REDIS_TLS_CLIENT_CERT",
                };
                v.error(name, e.to_string());
                None
            }
        },
        (Some(_), None) | (None, Some(_)) => {
            v.error(
                "REDIS_TLS_CLIENT_CERT",
                "and REDIS_TLS_CLIENT_KEY go together: set both or neither",
            );
            None
        }
    };
    let root_cert = ca.and_then(|ca| match tls::load_roots(&ca) {
        Ok(_) => read(v, "REDIS_TLS_CACERT", &ca),
        Err(e) => {
            v.error("REDIS_TLS_CACERT", e.to_string());
            None
        }
    });
    let certs = (client_tls.is_some() || root_cert.is_some()).then_some(redis::TlsCertificates {
        client_tls,
        root_cert,
    });
    RedisTls {
        certs,
        skip_hostname_verification,
    }
}

/// `REDIS_PERSECOND`: the per-second Redis, which needs global mode's (`main`) and a URL of
/// its own. The call timeout defaults to the main one's (`timeout`).
///
/// What counts as per-second is decided where limits are routed (`global::queue`).
fn per_second(
    v: &mut Values<'_>,
    main: bool,
    timeout: Duration,
    tls: &RedisTls,
) -> Option<PerSecondRedis> {
    // Off, its other variables mean nothing (as in the reference), bad values included.
    if !v.or("REDIS_PERSECOND", false, boolean) {
        return None;
    }
    let redis = redis(v, &PER_SECOND, tls);
    let timeout = v
        .parse("REDIS_PERSECOND_TIMEOUT", positive_duration)
        .unwrap_or(timeout);
    if !main {
        v.error(
            "REDIS_PERSECOND",
            "needs REDIS_URL: a per-second Redis only splits global mode's counters",
        );
        return None;
    }
    if redis.is_none() && v.raw("REDIS_PERSECOND_URL").is_none() {
        v.error(
            "REDIS_PERSECOND_URL",
            "is required when REDIS_PERSECOND is true",
        );
    }
    Some(PerSecondRedis {
        redis: redis?,
        timeout,
    })
}

/// Global mode's sync cadence and bounds.
fn sync(v: &mut Values<'_>) -> (SyncSettings, usize) {
    let tick = v.parse("SYNC_TICK", duration);
    let interval = v.parse("SYNC_INTERVAL", duration);
    if let (Some(tick), Some(interval)) = (tick, interval) {
        if tick.is_zero() || interval < tick {
            v.error(
                "SYNC_TICK/SYNC_INTERVAL",
                format!(
                    "the tick ({tick:?}) must be positive and no longer than the interval ({interval:?})"
                ),
            );
        }
    }
    let timeout = v.or("REDIS_TIMEOUT", Duration::ZERO, positive_duration);
    let max_queued = v.or("SYNC_MAX_QUEUED", 0, number);
    let reset_log_length = v.or(
        "RESET_LOG_LENGTH",
        DEFAULT_RESET_LOG_LENGTH,
        at_least_one::<usize>,
    );
    if reset_log_length > MAX_RESET_LOG_LENGTH {
        v.error(
            "RESET_LOG_LENGTH",
            format!("{reset_log_length} is above the most, {MAX_RESET_LOG_LENGTH}"),
        );
    }
    let ms =
        |d: Option<Duration>| d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let settings = SyncSettings {
        policy: SyncPolicy {
            tick_ms: ms(tick),
            base_ms: ms(interval),
        },
        timeout,
        reset_log_length,
        ..SyncSettings::default()
    };
    (settings, max_queued)
}

#[cfg(test)]
mod tests;
