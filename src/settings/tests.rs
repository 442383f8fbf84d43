//! Tests of resolving `serve`'s settings: from flags and an injected environment, never the
//! process's own.

use super::*;
use crate::cli::{Cli, Command};
use clap::Parser;

/// `sluice serve ARGS` with environment `env`: never the process's own.
fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, Vec<SettingsError>> {
    let mut all = vec!["sluice", "serve"];
    all.extend_from_slice(args);
    let Command::Serve(a) = Cli::try_parse_from(all).unwrap().command else {
        unreachable!("parsed serve")
    };
    let env: std::collections::HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::resolve(&a, &env)
}

fn names(errs: &[SettingsError]) -> Vec<&'static str> {
    errs.iter().map(|e| e.setting).collect()
}

#[test]
fn defaults_are_the_references() {
    let s = resolve(&[], &[]).unwrap();
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(s.config_path, PathBuf::from("config/rules"));
    assert_eq!(s.options.near_limit_ratio, 0.8);
    assert_eq!(s.options.cache.max_entries, 1_000_000);
    assert_eq!(s.sync.timeout, Duration::from_millis(100));
    assert_eq!((s.sync.policy.tick_ms, s.sync.policy.base_ms), (1000, 2000));
    assert_eq!(s.http_header_read_timeout, Duration::from_secs(10));
    assert_eq!(s.http_idle_timeout, Duration::from_secs(60));
    assert_eq!(s.http_max_connections, 256);
    assert_eq!(
        (
            s.options.metric_series.max_key_bytes,
            s.options.metric_series.max_client_series
        ),
        (512, 10_000)
    );
    assert_eq!(
        (s.log_level.as_str(), s.log_format.as_str()),
        ("info", "text")
    );
    assert!(s.redis.is_none() && !s.merge_domains && s.options.response_headers.is_none());
}

#[test]
fn runtime_root_builds_the_config_path() {
    let s = resolve(
        &["--runtime-subdirectory", "ratelimit", "--grpc-port", "1"],
        &[("RUNTIME_ROOT", "/srv/rt"), ("PORT", "2")],
    )
    .unwrap();
    assert_eq!(s.config_path, PathBuf::from("/srv/rt/ratelimit/config"));
    assert_eq!((s.grpc_addr.port(), s.http_addr.port()), (1, 2));
}

#[test]
fn flags_beat_variables() {
    let s = resolve(
        &["--grpc-port", "1"],
        &[("GRPC_PORT", "2"), ("GRPC_HOST", "::1")],
    )
    .unwrap();
    assert_eq!(s.grpc_addr, "[::1]:1".parse().unwrap());
}

#[test]
fn booleans_take_reference_spellings() {
    let s = resolve(
        &[
            "--shadow-mode",
            "--limit-response-headers-enabled",
            "true",
            "--merge-domain-config",
            "1",
        ],
        &[("QUOTA_MODE", "yes"), ("LIMIT_RESET_HEADER", "X-Reset")],
    )
    .unwrap();
    assert!(s.options.shadow_mode && s.options.quota_mode && s.merge_domains);
    assert_eq!(s.options.response_headers.unwrap().reset, "X-Reset");
    let off = resolve(&["--shadow-mode", "false"], &[("SHADOW_MODE", "true")]).unwrap();
    assert!(!off.options.shadow_mode);
    assert_eq!(
        names(&resolve(&[], &[("QUOTA_MODE", "maybe")]).unwrap_err()),
        vec!["QUOTA_MODE"]
    );
}

#[test]
fn redis_settings_take_the_reference_forms() {
    let s = resolve(
        &["--redis-url", "r1:6379", "--redis-url", "redis://r2:6380"],
        &[
            ("REDIS_AUTH", "u:p"),
            ("CACHE_KEY_PREFIX", "x:"),
            ("REDIS_TYPE", "cluster"),
        ],
    )
    .unwrap();
    let r = s.redis.unwrap();
    assert_eq!(r.urls, vec!["redis://u:p@r1:6379", "redis://u:p@r2:6380"]);
    assert!(r.cluster);
    assert_eq!(r.options.prefix, "x:");
    assert!(
        !format!("{r:?}").contains("u:p"),
        "credentials are redacted in Debug"
    );
    let env = resolve(&[], &[("REDIS_URL", "a:1, b:2"), ("REDIS_TLS", "true")]).unwrap();
    assert_eq!(
        env.redis.unwrap().urls,
        vec!["rediss://a:1", "rediss://b:2"]
    );
}

#[test]
fn sentinel_takes_the_master_name_first_and_its_own_auth() {
    let s = resolve(
        &[],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster, s1:26379,redis://s2:26380"),
            ("REDIS_AUTH", "masterpw"),
            ("REDIS_SENTINEL_AUTH", "sentinelpw"),
        ],
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    let r = s.redis.unwrap();
    let master = r.sentinel.clone().expect("sentinel");
    assert_eq!(master.name, "mymaster");
    assert!(!master.tls);
    assert!(!r.cluster);
    // The sentinels get REDIS_SENTINEL_AUTH; REDIS_AUTH stays the master's.
    assert_eq!(
        r.urls,
        vec![
            "redis://:sentinelpw@s1:26379",
            "redis://:sentinelpw@s2:26380"
        ]
    );
    assert_eq!(r.options.auth.as_deref(), Some("masterpw"));
    assert!(!format!("{r:?}").contains("pw"), "{r:?}");
    // TLS reaches the sentinels and the master alike.
    let tls = resolve(
        &[],
        &[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "m,s1:1"),
            ("REDIS_TLS", "true"),
        ],
    )
    .unwrap()
    .redis
    .unwrap();
    assert_eq!(tls.urls, vec!["rediss://s1:1"]);
    assert!(tls.sentinel.unwrap().tls);
    // The master's name alone, or a URL where the name goes, is refused.
    for url in ["mymaster", "redis://s1:26379,s2:26379"] {
        let errs = resolve(&[], &[("REDIS_TYPE", "SENTINEL"), ("REDIS_URL", url)]).unwrap_err();
        assert_eq!(names(&errs), vec!["REDIS_URL"], "{url}");
        assert!(errs[0].message.contains("<master name>"), "{}", errs[0]);
    }
}

#[test]
fn per_second_redis_takes_its_own_variables() {
    let s = resolve(
        &[],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_TIMEOUT", "300ms"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "m,ps1:26379"),
            ("REDIS_PERSECOND_TYPE", "SENTINEL"),
            ("REDIS_PERSECOND_AUTH", "pw"),
            ("REDIS_PERSECOND_SENTINEL_AUTH", "spw"),
            ("REDIS_PERSECOND_POOL_SIZE", "7"),
        ],
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert_eq!(s.redis.unwrap().urls, vec!["redis://main:6379"]);
    let p = s.redis_per_second.expect("per-second Redis");
    assert_eq!(p.redis.urls, vec!["redis://:spw@ps1:26379"]);
    assert_eq!(p.redis.sentinel.unwrap().name, "m");
    assert_eq!(p.redis.options.auth.as_deref(), Some("pw"));
    assert_eq!(p.redis.options.pool_size, 7);
    assert_eq!(p.timeout, Duration::from_millis(300), "REDIS_TIMEOUT's");
    let own = resolve(
        &[],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "ps:6379"),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_PERSECOND_TIMEOUT", "2s"),
        ],
    )
    .unwrap()
    .redis_per_second
    .unwrap();
    assert_eq!(own.redis.urls, vec!["rediss://ps:6379"]);
    assert_eq!(own.timeout, Duration::from_secs(2));
    // Off (the default), its variables mean nothing, as in the reference.
    let off = resolve(&[], &[("REDIS_URL", "a:1"), ("REDIS_PERSECOND_URL", "b:1")]).unwrap();
    assert!(off.redis_per_second.is_none());
    // On, it needs its URL, and global mode.
    let errs = resolve(&[], &[("REDIS_URL", "a:1"), ("REDIS_PERSECOND", "true")]).unwrap_err();
    assert_eq!(names(&errs), vec!["REDIS_PERSECOND_URL"]);
    let errs = resolve(
        &[],
        &[("REDIS_PERSECOND", "true"), ("REDIS_PERSECOND_URL", "b:1")],
    )
    .unwrap_err();
    assert_eq!(names(&errs), vec!["REDIS_PERSECOND"]);
}

#[test]
fn every_bad_setting_is_reported_at_once_parse_errors_included() {
    let errs = resolve(
        &["--grpc-host", "not a host", "--log-format", "xml"],
        &[
            ("REDIS_TIMEOUT", "xyz"),
            ("NEAR_LIMIT_RATIO", "5"),
            ("REDIS_TYPE", "FOO"),
            ("PORT", "99999"),
            ("LOG_LEVEL", "verbose"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        vec![
            "GRPC_HOST/GRPC_PORT",
            "PORT",
            "NEAR_LIMIT_RATIO",
            "REDIS_TYPE",
            "REDIS_TIMEOUT",
            "LOG_LEVEL",
            "LOG_FORMAT",
        ]
    );
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert!(
        text[2].starts_with("NEAR_LIMIT_RATIO (--near-limit-ratio): '5' is not between 0 and 1"),
        "{}",
        text[2]
    );
    assert!(
        text[4].starts_with("REDIS_TIMEOUT (--redis-timeout): 'xyz' is not a duration"),
        "{}",
        text[4]
    );
    assert_eq!(
        text[6],
        "LOG_FORMAT (--log-format): 'xml' is not one of text, json"
    );
}

#[test]
fn bounds_are_checked() {
    let errs = resolve(
        &["--cache-max-entries", "0", "--http-max-connections", "0"],
        &[
            ("HTTP_HEADER_READ_TIMEOUT", "0s"),
            ("HTTP_IDLE_TIMEOUT", "soon"),
            ("SYNC_TICK", "5s"),
            ("REDIS_POOL_SIZE", "0"),
            ("MAX_VALUE_BYTES", "0"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        vec![
            "HTTP_HEADER_READ_TIMEOUT",
            "HTTP_IDLE_TIMEOUT",
            "HTTP_MAX_CONNECTIONS",
            "MAX_VALUE_BYTES",
            "CACHE_MAX_ENTRIES",
            "REDIS_POOL_SIZE",
            "SYNC_TICK/SYNC_INTERVAL",
        ]
    );
    assert_eq!(errs[4].message, "'0' is not at least 1");
    let s = resolve(
        &["--http-max-connections", "3"],
        &[
            ("HTTP_HEADER_READ_TIMEOUT", "2s"),
            ("HTTP_IDLE_TIMEOUT", "1m"),
            ("CACHE_MAX_ENTRIES", "1"),
        ],
    )
    .unwrap();
    assert_eq!(
        (
            s.http_header_read_timeout,
            s.http_idle_timeout,
            s.http_max_connections
        ),
        (Duration::from_secs(2), Duration::from_secs(60), 3)
    );
    assert_eq!(s.options.cache.max_entries, 1);
}

#[test]
fn metric_series_bounds_are_checked() {
    let errs = resolve(
        &["--metrics-max-key-bytes", "63"],
        &[("METRICS_MAX_CLIENT_SERIES", "many")],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        vec!["METRICS_MAX_KEY_BYTES", "METRICS_MAX_CLIENT_SERIES"]
    );
    assert_eq!(errs[0].message, "'63' is not at least 64");
    let s = resolve(
        &["--metrics-max-client-series", "0"],
        &[("METRICS_MAX_KEY_BYTES", "64")],
    )
    .unwrap();
    assert_eq!(
        s.options.metric_series,
        crate::telemetry::SeriesBounds {
            max_key_bytes: 64,
            max_client_series: 0
        }
    );
}

#[test]
fn secrets_stay_out_of_errors_and_debug() {
    let errs = resolve(
        &[],
        &[
            ("REDIS_URL", "http://u:hunter2@h:1"),
            ("REDIS_AUTH", "hunter2"),
        ],
    )
    .unwrap_err();
    assert_eq!(names(&errs), vec!["REDIS_URL"]);
    assert!(!errs[0].to_string().contains("hunter2"), "{}", errs[0]);
    let Command::Serve(a) = Cli::try_parse_from(["sluice", "serve", "--redis-auth", "hunter2"])
        .unwrap()
        .command
    else {
        unreachable!()
    };
    assert!(!format!("{a:?}").contains("hunter2"));
}

#[test]
fn log_levels_take_the_references_names_and_directives() {
    let level = |l: &str| resolve(&[], &[("LOG_LEVEL", l)]).map(|s| s.log_level);
    assert_eq!(level("WARNING").unwrap(), "warn");
    assert_eq!(level("sluice=debug,info").unwrap(), "sluice=debug,info");
    assert!(level("verbose").is_err());
}

#[test]
fn clock_skew_is_signed() {
    let s = resolve(&["--clock-skew", "-5s"], &[]).unwrap();
    assert_eq!(s.clock_skew_ms, -5000);
}

#[test]
fn help_shows_variables_and_defaults_but_no_values() {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let help = cmd
        .find_subcommand_mut("serve")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(
        help.contains("[env: REDIS_AUTH]")
            && help.contains("[env: HTTP_MAX_CONNECTIONS] [default: 256]"),
        "{help}"
    );
    assert!(
        !help.contains("SLUICE_CLOCK_SKEW"),
        "the testing aid is hidden"
    );
}

#[test]
fn every_setting_has_a_distinct_variable_and_flag() {
    for (i, a) in SERVE.iter().enumerate() {
        for b in &SERVE[i + 1..] {
            assert!(a.env != b.env && a.flag != b.flag, "{} / {}", a.env, b.env);
        }
    }
}

#[test]
fn the_docs_settings_table_names_every_setting() {
    // Read at compile time: docs/settings.md's settings table must name every visible variable.
    let doc = include_str!("../../docs/settings.md");
    // Only the part before the reference's table: a variable named only there is not
    // documented as a setting.
    let end = doc.find("<!-- reference-env -->").unwrap();
    let table = &doc[..end];
    let mut missing = Vec::new();
    for s in SERVE.iter().filter(|s| s.shape != Shape::Hidden) {
        // GRPC_ADDR and HTTP_ADDR appear as their flags, which override GRPC_HOST/PORT, HOST/PORT.
        let named =
            table.contains(&format!("`{}`", s.env)) || table.contains(&format!("`--{}`", s.flag));
        if !named {
            missing.push(s.env);
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/settings.md's settings table: {missing:?}"
    );
}

#[test]
fn the_docs_list_every_reference_variable_as_the_code_treats_it() {
    use super::reference::{Treatment, REFERENCE_ENV};
    let doc = include_str!("../../docs/settings.md");
    let start = doc
        .find("<!-- reference-env -->")
        .expect("the table's start marker");
    let end = doc
        .find("<!-- /reference-env -->")
        .expect("the table's end marker");
    let rows: Vec<(String, String)> = doc[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| {
            let (name, rest) = l.split_once("` | ").expect("| `NAME` | treatment |");
            let word = rest.split([':', ',', ' ']).next().unwrap_or_default();
            (name.to_string(), word.to_string())
        })
        .collect();
    let expected: Vec<(String, String)> = REFERENCE_ENV
        .iter()
        .map(|(name, t)| {
            let word = match t {
                Treatment::Same => "same",
                Treatment::Mapped(_) => "mapped",
                Treatment::Ignored(..) => "ignored",
                Treatment::Refused(..) => "refused",
            };
            (name.to_string(), word.to_string())
        })
        .collect();
    assert_eq!(rows, expected);
    assert!(REFERENCE_ENV.len() > 100, "the whole of settings.go");
    for &(name, t) in REFERENCE_ENV {
        match t {
            Treatment::Same | Treatment::Mapped(_) => {
                assert!(flags::spec_of(name).is_some(), "{name} is a sluice setting");
            }
            // A value no list accepts: it warns, or it is refused, naming the variable.
            Treatment::Ignored(..) => {
                let s = resolve(&[], &[(name, "x-unlikely")]).expect(name);
                assert_eq!(s.warnings.len(), 1, "{name}");
                assert!(s.warnings[0].starts_with(name), "{}", s.warnings[0]);
            }
            Treatment::Refused(..) => {
                let errs = resolve(&[], &[(name, "x-unlikely")]).unwrap_err();
                assert_eq!(names(&errs), vec![name]);
                assert!(
                    errs[0].message.contains("is refused"),
                    "{}",
                    errs[0].message
                );
            }
        }
    }
    // The values that mean what sluice does anyway pass quietly.
    let s = resolve(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("BACKEND_TYPE", "redis"),
            ("CONFIG_TYPE", "FILE"),
        ],
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    let errs = resolve(&[], &[("BACKEND_TYPE", "memcache")]).unwrap_err();
    assert_eq!(
        errs[0].to_string(),
        "BACKEND_TYPE: 'memcache' is refused: only redis is supported: counters live in memory and sync through Redis"
    );
}

#[test]
fn grpc_tls_is_off_by_default_and_needs_its_files() {
    assert_eq!(resolve(&[], &[]).unwrap().grpc_tls, None);
    let errs = resolve(&["--grpc-server-use-tls"], &[]).unwrap_err();
    assert_eq!(
        names(&errs),
        ["GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"]
    );
    assert_eq!(
        errs[0].to_string(),
        "GRPC_SERVER_TLS_CERT (--grpc-server-tls-cert): is required when GRPC_SERVER_USE_TLS is true"
    );
}

#[test]
fn grpc_tls_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let junk = dir.path().join("junk.key");
    std::fs::write(&junk, "not a key\n").unwrap();
    let (missing_s, junk_s) = (missing.to_str().unwrap(), junk.to_str().unwrap());
    let env = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", missing_s),
        ("GRPC_SERVER_TLS_KEY", junk_s),
        ("GRPC_CLIENT_TLS_CACERT", junk_s),
    ];
    let errs = resolve(&[], &env).unwrap_err();
    assert_eq!(
        names(&errs),
        ["GRPC_SERVER_TLS_CERT", "GRPC_CLIENT_TLS_CACERT"]
    );
    assert!(errs[0].message.starts_with(missing_s), "{}", errs[0]);
    assert!(errs[1].message.starts_with(junk_s), "{}", errs[1]);
    assert!(
        errs[1].message.contains("no PEM certificate"),
        "{}",
        errs[1]
    );
}

#[test]
fn client_verification_needs_tls_and_the_san_needs_a_ca() {
    let errs = resolve(&["--grpc-client-tls-cacert", "/ca.pem"], &[]).unwrap_err();
    assert_eq!(names(&errs), ["GRPC_SERVER_USE_TLS"]);
    let errs = resolve(
        &[
            "--grpc-server-use-tls",
            "--grpc-client-tls-san",
            "not a name!",
        ],
        &[("GRPC_SERVER_TLS_CERT", ""), ("GRPC_SERVER_TLS_KEY", "")],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        [
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_SAN",
            "GRPC_CLIENT_TLS_SAN"
        ]
    );
    assert!(errs[2].message.contains("needs GRPC_CLIENT_TLS_CACERT"));
    assert!(errs[3].message.contains("not a DNS name or IP address"));
}

#[test]
fn xds_takes_the_references_variables() {
    let s = resolve(&[], &[]).unwrap();
    assert!(s.xds.is_none(), "CONFIG_TYPE defaults to FILE");
    let s = resolve(&[], &[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap();
    let x = s.xds.unwrap();
    assert_eq!(
        (x.server_url.as_str(), x.node_id.as_str()),
        ("localhost:18000", "default")
    );
    assert_eq!(
        (x.retry_interval, x.retry_max),
        (Duration::from_secs(3), Duration::from_secs(60))
    );
    assert!(x.tls.is_none() && x.headers.is_empty() && x.node_metadata.is_empty());
    assert!(!x.force_start && !x.need_a_domain && x.max_message_bytes.is_none());

    let s = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "grpc_xds_sotw"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds.internal:18000"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,key1:val1,team=b=c"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "Authorization:Bearer t,x-a:1",
            ),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
        ],
    )
    .unwrap();
    let x = s.xds.unwrap();
    let pairs = |v: &[(String, String)]| {
        v.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&x.node_metadata), ["zone=a", "team=b=c"]);
    assert_eq!(pairs(&x.headers), ["authorization=Bearer t", "x-a=1"]);
    assert_eq!(x.max_message_bytes, Some(1_048_576));
    assert_eq!(
        s.warnings,
        ["CONFIG_GRPC_XDS_NODE_METADATA: 'key1:val1' is not key=value and is not sent"]
    );
    assert!(
        !format!("{x:?}").contains("Bearer"),
        "header values stay out of Debug"
    );
}

#[test]
fn bad_xds_settings_are_reported() {
    let errs = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0s"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "token-only"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        [
            "CONFIG_TYPE",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        ]
    );
    assert_eq!(
        errs[1].message,
        "'<redacted>' holds an entry that is not name:value"
    );
    let errs = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "http://x:1"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/nonexistent.crt"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        [
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_SERVER_URL"
        ]
    );
    let errs = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent-ca.crt"),
        ],
    )
    .unwrap_err();
    assert_eq!(names(&errs), ["CONFIG_GRPC_XDS_SERVER_TLS_CACERT"]);
    assert!(errs[0].message.contains("/nonexistent-ca.crt"), "{errs:?}");
    // With files, the TLS files are not read.
    resolve(
        &[],
        &[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent-ca.crt"),
        ],
    )
    .unwrap();
}

#[test]
fn otlp_settings_have_the_references_defaults_and_meanings() {
    use crate::telemetry::otel::Protocol;
    let s = resolve(&[], &[]).unwrap().otlp;
    assert!(!s.tracing && !s.metrics);
    assert_eq!(s.protocol, Protocol::Http);
    assert_eq!(s.service_name, "RateLimit");
    assert_eq!(
        (s.service_namespace.as_str(), s.service_instance_id),
        ("", None)
    );
    assert_eq!(s.sampling_rate, 1.0);
    assert_eq!(
        s.endpoints.traces(s.protocol),
        "http://localhost:4318/v1/traces"
    );

    let s = resolve(
        &["--tracing-sampling-rate", "0.5"],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "GRPC"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
        ],
    )
    .unwrap()
    .otlp;
    assert!(
        s.tracing && !s.metrics,
        "the common endpoint alone sends no metrics"
    );
    assert_eq!(s.protocol, Protocol::Grpc);
    assert_eq!(s.sampling_rate, 0.5);
    assert_eq!(s.service_instance_id.as_deref(), Some("pod-1"));
    assert_eq!(s.endpoints.traces(s.protocol), "http://collector:4317");

    // As the reference: any number, past 1 always, under 0 never.
    let rate = |r| {
        resolve(&[], &[("TRACING_SAMPLING_RATE", r)])
            .unwrap()
            .otlp
            .sampling_rate
    };
    assert_eq!((rate("7"), rate("-1")), (1.0, 0.0));
    // OTLP metrics: asked for by name, or by naming their endpoint.
    let metrics = |env: &[(&str, &str)]| resolve(&[], env).unwrap().otlp.metrics;
    assert!(metrics(&[("OTEL_METRICS_EXPORTER", "prometheus, otlp")]));
    assert!(metrics(&[(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "http://m:4318/v1/metrics"
    )]));
    assert!(!metrics(&[("OTEL_METRICS_EXPORTER", "none")]));
}

#[test]
fn bad_otlp_settings_are_refused_by_name() {
    let errs = resolve(
        &[],
        &[
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
            ("TRACING_SAMPLING_RATE", "often"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318"),
            ("OTEL_METRICS_EXPORTER", "console"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        vec![
            "TRACING_EXPORTER_PROTOCOL",
            "TRACING_SAMPLING_RATE",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_METRICS_EXPORTER",
        ]
    );
    assert!(errs[2].message.contains("TLS"), "{}", errs[2]);
}

#[test]
fn redis_tls_files_are_read_at_start_and_errors_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("redis-certs").join("tls.crt");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let (missing_s, junk_s) = (missing.to_str().unwrap(), junk.to_str().unwrap());
    let errs = resolve(
        &[],
        &[
            ("REDIS_URL", "redis:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", missing_s),
            ("REDIS_TLS_CLIENT_KEY", junk_s),
            ("REDIS_TLS_CACERT", junk_s),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        ["REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CACERT"],
        "{errs:?}"
    );
    assert!(errs[0].message.starts_with(missing_s), "{}", errs[0]);
    assert!(errs[1].message.starts_with(junk_s), "{}", errs[1]);
    // A certificate needs its key.
    let errs = resolve(
        &[],
        &[
            ("REDIS_URL", "redis:6379"),
            ("REDIS_TLS_CLIENT_CERT", junk_s),
        ],
    )
    .unwrap_err();
    assert_eq!(names(&errs), ["REDIS_TLS_CLIENT_CERT"]);
    assert!(errs[0].message.contains("go together"), "{}", errs[0]);
    // Local mode dials no Redis, so its files are not read.
    let s = resolve(&[], &[("REDIS_TLS_CLIENT_CERT", missing_s)]).unwrap();
    assert!(s.redis.is_none());
}

#[test]
fn redis_tls_applies_to_the_per_second_redis_and_skipping_names_is_refused_with_sentinel() {
    let s = resolve(
        &[],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "ps:6379"),
            ("REDIS_PERSECOND_TYPE", "CLUSTER"),
            ("REDIS_PERSECOND_TLS", "true"),
        ],
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert!(s.redis.unwrap().options.tls.skip_hostname_verification);
    let p = s.redis_per_second.unwrap();
    assert!(p.redis.options.tls.skip_hostname_verification);
    let errs = resolve(
        &[],
        &[
            ("REDIS_URL", "m,sentinel:26379"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ],
    )
    .unwrap_err();
    assert_eq!(names(&errs), ["REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"]);
    assert!(errs[0].message.contains("SENTINEL"), "{}", errs[0]);
    // Without TLS there is no name to check: nothing to refuse.
    resolve(
        &[],
        &[
            ("REDIS_URL", "m,sentinel:26379"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ],
    )
    .unwrap();
}
