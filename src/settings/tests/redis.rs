//! Tests of the Redis settings: the main and per-second Redis, Sentinel, and their TLS files.

use super::*;

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

#[test]
fn the_join_timeout_reaches_global_mode_and_zero_turns_the_join_off() {
    let global = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push(("REDIS_URL", "r:6379"));
        resolve(&[], &env)
            .unwrap()
            .global()
            .unwrap()
            .sync
            .join_timeout
    };
    assert_eq!(global(&[]), Duration::from_secs(2));
    assert_eq!(
        global(&[("SYNC_JOIN_TIMEOUT", "500ms")]),
        Duration::from_millis(500)
    );
    assert_eq!(global(&[("SYNC_JOIN_TIMEOUT", "0")]), Duration::ZERO);
    let flag = resolve(&["--sync-join-timeout", "5s"], &[]).unwrap();
    assert_eq!(flag.sync_join_timeout, Duration::from_secs(5));
    let errs = resolve(&[], &[("SYNC_JOIN_TIMEOUT", "soon")]).unwrap_err();
    assert_eq!(names(&errs), vec!["SYNC_JOIN_TIMEOUT"]);
}

#[test]
fn the_reset_log_length_is_bounded() {
    let s = resolve(&[], &[]).unwrap();
    assert_eq!(s.sync.reset_log_length, 10_000);
    let s = resolve(&["--reset-log-length", "1000000"], &[]).unwrap();
    assert_eq!(s.sync.reset_log_length, 1_000_000);
    for bad in ["0", "1000001"] {
        let errs = resolve(&[], &[("RESET_LOG_LENGTH", bad)]).unwrap_err();
        assert_eq!(names(&errs), vec!["RESET_LOG_LENGTH"], "{bad}");
    }
}
