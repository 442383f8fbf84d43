//! Command line and environment: every setting has a flag and an environment variable, with
//! envoyproxy/ratelimit's variable names and defaults where the meaning is shared. `Settings`
//! is the resolved form `lib::run` takes; resolving reports every bad setting at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};

use crate::core::table::CacheSettings;
use crate::core::SyncPolicy;
use crate::global::redis::{normalize_url, RedisOptions};
use crate::global::SyncSettings;
use crate::rls::{HeaderNames, Options};

/// sluice: an external rate-limit service for Envoy and Istio.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the rate-limit service.
    Serve(Box<ServeArgs>),
    /// Validate rules files; exit 1 listing every error.
    Check(CheckArgs),
    /// Send one ShouldRateLimit request and print the response.
    Query(QueryArgs),
    /// Drive ShouldRateLimit and print throughput and latency percentiles.
    Load(LoadArgs),
    /// Run the fleet simulator (global mode vs. the plain design) and print its table.
    Simulate,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// Flags of `sluice serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Rules: a YAML file or a directory of *.yaml/*.yml files. Default: RUNTIME_ROOT/
    /// RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY when RUNTIME_ROOT is set, else config/rules.
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// envoyproxy/ratelimit's runtime root.
    #[arg(long, env = "RUNTIME_ROOT")]
    pub runtime_root: Option<PathBuf>,
    /// envoyproxy/ratelimit's runtime subdirectory.
    #[arg(long, env = "RUNTIME_SUBDIRECTORY", default_value = "")]
    pub runtime_subdirectory: String,
    /// envoyproxy/ratelimit's runtime app directory.
    #[arg(long, env = "RUNTIME_APPDIRECTORY", default_value = "config")]
    pub runtime_appdirectory: String,

    /// gRPC listen address; overrides GRPC_HOST/GRPC_PORT.
    #[arg(long, env = "GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// gRPC listen host.
    #[arg(long, env = "GRPC_HOST", default_value = "0.0.0.0")]
    pub grpc_host: String,
    /// gRPC listen port.
    #[arg(long, env = "GRPC_PORT", default_value_t = 8081)]
    pub grpc_port: u16,
    /// HTTP listen address; overrides HOST/PORT.
    #[arg(long, env = "HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// HTTP listen host.
    #[arg(long = "host", env = "HOST", default_value = "0.0.0.0")]
    pub http_host: String,
    /// HTTP listen port.
    #[arg(long = "port", env = "PORT", default_value_t = 8080)]
    pub http_port: u16,

    /// Log level (trace, debug, info, warn, error) or an env-filter directive.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: String,

    /// Report OK overall whatever the outcome (per-descriptor statuses are kept).
    #[arg(long, env = "SHADOW_MODE", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub shadow_mode: bool,
    /// Treat every rule as a quota (see quota_mode).
    #[arg(long, env = "QUOTA_MODE", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub quota_mode: bool,
    /// Add RateLimit-Limit/-Remaining/-Reset (and Retry-After when over) response headers.
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub limit_response_headers_enabled: bool,
    /// Name of the limit header.
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,
    /// Name of the remaining header.
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub limit_remaining_header: String,
    /// Name of the reset header.
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,
    /// When any descriptor of a request goes over, do not count the others.
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub stop_cache_key_increment_when_overlimit: bool,
    /// Merge files that share a domain instead of rejecting them.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub merge_domain_config: bool,
    /// Share of the limit past which hits count as near_limit in metrics.
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,

    /// Redis URL(s) for global mode: repeat the flag or separate with commas.
    #[arg(long = "redis-url", env = "REDIS_URL", value_delimiter = ',')]
    pub redis_url: Vec<String>,
    /// Redis deployment: SINGLE or CLUSTER.
    #[arg(long, env = "REDIS_TYPE", default_value = "SINGLE")]
    pub redis_type: String,
    /// Redis password or user:pass.
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    pub redis_auth: Option<String>,
    /// Use TLS to Redis (`rediss://`); the server is verified against the system's roots,
    /// or the bundle named by `SSL_CERT_FILE`.
    #[arg(long, env = "REDIS_TLS", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub redis_tls: bool,
    /// Prefix of every Redis key.
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "")]
    pub cache_key_prefix: String,
    /// Connections per Redis shard.
    #[arg(long, env = "REDIS_POOL_SIZE", default_value_t = 4)]
    pub redis_pool_size: usize,
    /// Timeout of one Redis call (a sync round trip).
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "100ms", value_parser = duration)]
    pub redis_timeout: Duration,
    /// Tick of the sync tasks: how often each shard sends one round trip.
    #[arg(long, env = "SYNC_TICK", default_value = "1s", value_parser = duration)]
    pub sync_tick: Duration,
    /// Base sync interval: Normal entities sync this often, Low 4×, Idle 8×, Hot every tick.
    #[arg(long, env = "SYNC_INTERVAL", default_value = "2s", value_parser = duration)]
    pub sync_interval: Duration,
    /// Most entities waiting to sync (bounds memory while Redis is down).
    #[arg(long, env = "SYNC_MAX_QUEUED", default_value_t = 1_000_000)]
    pub sync_max_queued: usize,

    /// Most entities (rule + descriptor values) kept in memory.
    #[arg(long, env = "CACHE_MAX_ENTRIES", default_value_t = 1_000_000)]
    pub cache_max_entries: u64,
    /// Drop an entity unused this long (never before twice its window).
    #[arg(long, env = "CACHE_IDLE_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub cache_idle_timeout: Duration,
    /// Upper bound on an entity's idle lifetime (unset: none).
    #[arg(long, env = "CACHE_TTL", value_parser = duration)]
    pub cache_ttl: Option<Duration>,

    /// Most descriptors in one request.
    #[arg(long, env = "MAX_DESCRIPTORS", default_value_t = 64)]
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    #[arg(long, env = "MAX_DESCRIPTOR_ENTRIES", default_value_t = 32)]
    pub max_descriptor_entries: usize,
    /// Longest entry key or value, in bytes.
    #[arg(long, env = "MAX_VALUE_BYTES", default_value_t = 4096)]
    pub max_value_bytes: usize,

    /// Testing aid: pretend this machine's clock is off by this much (e.g. `30s`, `-5s`); in
    /// global mode the offset measured from Redis `TIME` corrects it.
    #[arg(
        long,
        env = "SLUICE_CLOCK_SKEW",
        hide = true,
        allow_hyphen_values = true
    )]
    pub clock_skew: Option<String>,

    /// Time given to in-flight calls on SIGTERM before exiting anyway.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "20s", value_parser = duration)]
    pub shutdown_grace: Duration,
    /// Quiet time after a rules change before reloading.
    #[arg(long, env = "RELOAD_DEBOUNCE", default_value = "200ms", value_parser = duration)]
    pub reload_debounce: Duration,
}

/// Flags of `sluice check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Rules files or directories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Merge files that share a domain.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", value_parser = BoolishValueParser::new(), action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub merge_domain_config: bool,
}

/// Flags of `sluice query`.
#[derive(Debug, Clone, Args)]
pub struct QueryArgs {
    /// The service's gRPC address.
    #[arg(long, env = "SLUICE_ADDR", default_value = "http://127.0.0.1:8081")]
    pub addr: String,
    /// The domain.
    #[arg(long)]
    pub domain: String,
    /// Descriptors, each `key=value[,key2=value2...]`.
    #[arg(required = true)]
    pub descriptors: Vec<String>,
    /// Request-level hits_addend (0 means 1, as Envoy sends it).
    #[arg(long, default_value_t = 0)]
    pub hits_addend: u32,
}

/// Flags of `sluice load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// The service's gRPC address.
    #[arg(long, env = "SLUICE_ADDR", default_value = "http://127.0.0.1:8081")]
    pub addr: String,
    /// The domain.
    #[arg(long, default_value = "load")]
    pub domain: String,
    /// The descriptor key; values are `v0`..`v{values-1}`.
    #[arg(long, default_value = "user")]
    pub key: String,
    /// Distinct descriptor values.
    #[arg(long, default_value_t = 10_000)]
    pub values: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// HTTP/2 connections shared by the workers.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub duration: Duration,
    /// Total requests per second (open loop); unset: as fast as responses come (closed loop).
    #[arg(long)]
    pub rate: Option<u64>,
}

/// Process settings resolved from [`ServeArgs`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// Rules file or directory.
    pub config_path: PathBuf,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Merge files sharing a domain.
    pub merge_domains: bool,
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
    /// Sync cadence, timeouts and bounds (global mode).
    pub sync: SyncSettings,
    /// Most entities waiting to sync.
    pub sync_max_queued: usize,
    /// Testing aid: milliseconds added to the system clock before any correction.
    pub clock_skew_ms: i64,
}

/// Where global mode keeps the fleet's counters.
#[derive(Clone)]
pub struct RedisSettings {
    /// Normalized URLs (credentials included: never log them; use `redis::redact`).
    pub urls: Vec<String>,
    /// A Redis Cluster (the URLs are seeds) rather than standalone shards.
    pub cluster: bool,
    /// Auth, prefix, pool size.
    pub options: RedisOptions,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self
            .urls
            .iter()
            .map(|u| crate::global::redis::redact(u))
            .collect();
        f.debug_struct("RedisSettings")
            .field("urls", &urls)
            .field("cluster", &self.cluster)
            .field("options", &self.options)
            .finish()
    }
}

/// One bad setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct SettingsError {
    /// The flag / variable.
    pub setting: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Settings {
    /// Resolves flags and environment into settings.
    ///
    /// # Errors
    /// Every bad setting, at once.
    pub fn resolve(a: ServeArgs) -> Result<Settings, Vec<SettingsError>> {
        let mut errors = Vec::new();
        let mut err = |setting, message: String| errors.push(SettingsError { setting, message });
        let mut addr = |explicit: Option<SocketAddr>, host: &str, port: u16, setting| {
            explicit.or_else(|| {
                let s = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                s.parse()
                    .map_err(|_| err(setting, format!("'{s}' is not an IP address and port")))
                    .ok()
            })
        };
        let grpc = addr(
            a.grpc_addr,
            &a.grpc_host,
            a.grpc_port,
            "GRPC_HOST/GRPC_PORT",
        );
        let http = addr(a.http_addr, &a.http_host, a.http_port, "HOST/PORT");
        if !(0.0..=1.0).contains(&a.near_limit_ratio) {
            err(
                "NEAR_LIMIT_RATIO",
                format!("{} is not between 0 and 1", a.near_limit_ratio),
            );
        }
        if !a.log_format.eq_ignore_ascii_case("json") && !a.log_format.eq_ignore_ascii_case("text")
        {
            err(
                "LOG_FORMAT",
                format!("'{}' is not text or json", a.log_format),
            );
        }
        let urls: Vec<&str> = a
            .redis_url
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .collect();
        let cluster = match a.redis_type.to_ascii_uppercase().as_str() {
            "SINGLE" => false,
            "CLUSTER" => true,
            other => {
                err("REDIS_TYPE", format!("'{other}' is not SINGLE or CLUSTER"));
                false
            }
        };
        let mut normalized = Vec::new();
        for u in &urls {
            match normalize_url(u, a.redis_auth.as_deref(), a.redis_tls) {
                Ok(n) => normalized.push(n),
                Err(e) => err("REDIS_URL", e),
            }
        }
        let redis = (!normalized.is_empty()).then(|| RedisSettings {
            urls: normalized,
            cluster,
            options: RedisOptions {
                auth: a.redis_auth.clone(),
                prefix: a.cache_key_prefix.clone(),
                pool_size: a.redis_pool_size,
            },
        });
        let clock_skew_ms = match a.clock_skew.as_deref().map(str::trim) {
            None | Some("") => 0,
            Some(v) => {
                let (neg, body) = v.strip_prefix('-').map_or((false, v), |b| (true, b));
                match humantime::parse_duration(body) {
                    Ok(d) => (d.as_millis() as i64) * if neg { -1 } else { 1 },
                    Err(e) => {
                        err("SLUICE_CLOCK_SKEW", e.to_string());
                        0
                    }
                }
            }
        };
        if a.sync_tick.is_zero() || a.sync_interval < a.sync_tick {
            err(
                "SYNC_TICK/SYNC_INTERVAL",
                "the tick must be positive and no longer than the interval".into(),
            );
        }
        if a.max_descriptors == 0 || a.max_descriptor_entries == 0 || a.max_value_bytes == 0 {
            err(
                "MAX_DESCRIPTORS/MAX_DESCRIPTOR_ENTRIES/MAX_VALUE_BYTES",
                "must be at least 1".into(),
            );
        }
        let config_path = a.config.clone().unwrap_or_else(|| match &a.runtime_root {
            Some(root) => root
                .join(&a.runtime_subdirectory)
                .join(&a.runtime_appdirectory),
            None => PathBuf::from("config/rules"),
        });
        let (Some(grpc_addr), Some(http_addr), true) = (grpc, http, errors.is_empty()) else {
            return Err(errors);
        };
        Ok(Settings {
            config_path,
            grpc_addr,
            http_addr,
            merge_domains: a.merge_domain_config,
            options: Options {
                shadow_mode: a.shadow_mode,
                quota_mode: a.quota_mode,
                response_headers: a.limit_response_headers_enabled.then(|| HeaderNames {
                    limit: a.limit_limit_header.clone(),
                    remaining: a.limit_remaining_header.clone(),
                    reset: a.limit_reset_header.clone(),
                }),
                stop_increment_when_over_limit: a.stop_cache_key_increment_when_overlimit,
                near_limit_ratio: a.near_limit_ratio,
                max_descriptors: a.max_descriptors,
                max_entries: a.max_descriptor_entries,
                max_value_bytes: a.max_value_bytes,
                cache: CacheSettings {
                    max_entries: a.cache_max_entries,
                    idle_timeout: a.cache_idle_timeout,
                    ttl: a.cache_ttl,
                },
            },
            log_level: a.log_level,
            log_format: a.log_format,
            shutdown_grace: a.shutdown_grace,
            reload_debounce: a.reload_debounce,
            redis,
            sync: SyncSettings {
                policy: SyncPolicy {
                    tick_ms: a.sync_tick.as_millis() as u64,
                    base_ms: a.sync_interval.as_millis() as u64,
                },
                timeout: a.redis_timeout,
                ..SyncSettings::default()
            },
            sync_max_queued: a.sync_max_queued,
            clock_skew_ms,
        })
    }

    /// Default settings on the given addresses, for embedding and tests.
    pub fn for_addrs(
        config_path: PathBuf,
        grpc_addr: SocketAddr,
        http_addr: SocketAddr,
    ) -> Settings {
        let cli = Cli::parse_from(["sluice", "serve"]);
        let Command::Serve(mut args) = cli.command else {
            unreachable!("parsed serve")
        };
        args.config = Some(config_path);
        args.grpc_addr = Some(grpc_addr);
        args.http_addr = Some(http_addr);
        args.redis_url.clear();
        Settings::resolve(*args).expect("default settings are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        let mut all = vec!["sluice", "serve"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).unwrap().command {
            Command::Serve(a) => *a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn runtime_root_builds_the_config_path() {
        let s = Settings::resolve(serve(&[
            "--runtime-root",
            "/srv/rt",
            "--runtime-subdirectory",
            "ratelimit",
            "--grpc-port",
            "1",
            "--port",
            "2",
        ]))
        .unwrap();
        assert_eq!(s.config_path, PathBuf::from("/srv/rt/ratelimit/config"));
        assert_eq!(s.grpc_addr.port(), 1);
    }

    #[test]
    fn booleans_take_reference_spellings() {
        let a = serve(&[
            "--shadow-mode",
            "--limit-response-headers-enabled",
            "true",
            "--merge-domain-config",
            "1",
        ]);
        assert!(a.shadow_mode && a.limit_response_headers_enabled && a.merge_domain_config);
        assert!(!serve(&["--shadow-mode", "false"]).shadow_mode);
    }

    #[test]
    fn redis_settings_take_the_reference_forms() {
        let s = Settings::resolve(serve(&[
            "--redis-url",
            "r1:6379,redis://r2:6380",
            "--redis-auth",
            "u:p",
            "--cache-key-prefix",
            "x:",
        ]))
        .unwrap();
        let r = s.redis.unwrap();
        assert_eq!(r.urls, vec!["redis://u:p@r1:6379", "redis://u:p@r2:6380"]);
        assert!(!r.cluster);
        assert!(
            !format!("{r:?}").contains("u:p"),
            "credentials are redacted in Debug"
        );
        let errs = Settings::resolve(serve(&["--redis-url", "r:1", "--redis-type", "SENTINEL"]))
            .unwrap_err();
        assert_eq!(errs[0].setting, "REDIS_TYPE");
    }

    #[test]
    fn every_bad_setting_is_reported_at_once() {
        let errs = Settings::resolve(serve(&[
            "--grpc-host",
            "not a host",
            "--near-limit-ratio",
            "3",
            "--log-format",
            "xml",
        ]))
        .unwrap_err();
        let names: Vec<_> = errs.iter().map(|e| e.setting).collect();
        assert_eq!(
            names,
            vec!["GRPC_HOST/GRPC_PORT", "NEAR_LIMIT_RATIO", "LOG_FORMAT"]
        );
    }
}
