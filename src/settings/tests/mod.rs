//! Tests of resolving `serve`'s settings: from flags and an injected environment, never the
//! process's own. Redis's in `redis.rs`; gRPC TLS, xDS and OTLP in `tls_xds_otlp.rs`.

use super::*;
use clap::{Args as _, FromArgMatches as _};

mod redis;
mod tls_xds_otlp;

/// `serve`'s flags parsed from `args` as the command line parses them (`cli/args.rs` tests
/// that `sluice serve` takes exactly these).
fn serve_args(args: &[&str]) -> ServeArgs {
    let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
    let matches = cmd
        .try_get_matches_from(std::iter::once(&"serve").chain(args))
        .unwrap();
    ServeArgs::from_arg_matches(&matches).unwrap()
}

/// `sluice serve ARGS` with environment `env`: never the process's own.
fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, Vec<SettingsError>> {
    let a = serve_args(args);
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
    assert!(s.redis.is_none() && !s.rules.merge_domains && s.options.response_headers.is_none());
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
    assert!(s.options.shadow_mode && s.options.quota_mode && s.rules.merge_domains);
    assert_eq!(s.options.response_headers.unwrap().reset, "X-Reset");
    let off = resolve(&["--shadow-mode", "false"], &[("SHADOW_MODE", "true")]).unwrap();
    assert!(!off.options.shadow_mode);
    assert_eq!(
        names(&resolve(&[], &[("QUOTA_MODE", "maybe")]).unwrap_err()),
        vec!["QUOTA_MODE"]
    );
}

#[test]
fn the_default_algorithm_is_sliding_unless_set_to_fixed() {
    use crate::core::Algorithm;
    let algorithm =
        |args: &[&str], env: &[(&str, &str)]| resolve(args, env).map(|s| s.rules.default_algorithm);
    assert_eq!(algorithm(&[], &[]), Ok(Algorithm::SlidingWindow));
    assert_eq!(
        algorithm(&[], &[("DEFAULT_ALGORITHM", "fixed_window")]),
        Ok(Algorithm::FixedWindow)
    );
    assert_eq!(
        algorithm(
            &["--default-algorithm", "sliding_window"],
            &[("DEFAULT_ALGORITHM", "fixed_window")]
        ),
        Ok(Algorithm::SlidingWindow)
    );
    let errs = resolve(&[], &[("DEFAULT_ALGORITHM", "token_bucket")]).unwrap_err();
    assert_eq!(names(&errs), ["DEFAULT_ALGORITHM"]);
    assert!(
        errs[0]
            .to_string()
            .contains("is not one of sliding_window, fixed_window"),
        "{}",
        errs[0]
    );
}

#[test]
fn the_quota_service_bounds_default_to_its_config_and_take_flags_and_variables() {
    let s = resolve(&[], &[]).unwrap();
    assert_eq!(s.rlqs, Some(crate::rlqs::Config::default()));
    let s = resolve(
        &["--rlqs-max-bucket-id-bytes", "256"],
        &[("RLQS_MAX_TRACKED_ID_BYTES", "4096")],
    )
    .unwrap();
    let rlqs = s.rlqs.unwrap();
    assert_eq!(
        (rlqs.max_bucket_id_bytes, rlqs.max_tracked_id_bytes),
        (256, 4096)
    );
    let bad = [
        ("RLQS_MAX_BUCKET_ID_BYTES", "0"),
        ("RLQS_MAX_TRACKED_ID_BYTES", "1k"),
    ];
    assert_eq!(
        names(&resolve(&[], &bad).unwrap_err()),
        vec!["RLQS_MAX_BUCKET_ID_BYTES", "RLQS_MAX_TRACKED_ID_BYTES"]
    );
}

#[test]
fn the_header_format_and_the_problem_body_are_chosen_by_name() {
    let s = resolve(&[], &[]).unwrap();
    assert_eq!(s.options.header_format, HeaderFormat::Reference);
    assert!(!s.options.problem_body);
    let s = resolve(
        &["--limit-response-headers-format", "IETF"],
        &[("LIMIT_RESPONSE_BODY", "problem")],
    )
    .unwrap();
    assert_eq!(s.options.header_format, HeaderFormat::Ietf);
    assert!(s.options.problem_body);
    let errs = resolve(
        &[],
        &[
            ("LIMIT_RESPONSE_HEADERS_FORMAT", "draft"),
            ("LIMIT_RESPONSE_BODY", "json"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        ["LIMIT_RESPONSE_HEADERS_FORMAT", "LIMIT_RESPONSE_BODY"]
    );
    assert!(
        errs[1].to_string().contains("is not one of none, problem"),
        "{}",
        errs[1]
    );
}

#[test]
fn the_rule_metadata_is_off_unless_asked_for_by_flag_or_variable() {
    let s = resolve(&[], &[]).unwrap();
    assert!(!s.options.rule_metadata);
    let s = resolve(&["--response-rule-metadata"], &[]).unwrap();
    assert!(s.options.rule_metadata);
    assert!(
        !s.options.dynamic_metadata,
        "one does not turn the other on"
    );
    let s = resolve(&[], &[("RESPONSE_RULE_METADATA", "true")]).unwrap();
    assert!(s.options.rule_metadata);
    let errs = resolve(&[], &[("RESPONSE_RULE_METADATA", "maybe")]).unwrap_err();
    assert_eq!(names(&errs), ["RESPONSE_RULE_METADATA"]);
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
    let a = serve_args(&["--redis-auth", "hunter2"]);
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
    let doc = include_str!("../../../docs/settings.md");
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
    let doc = include_str!("../../../docs/settings.md");
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
