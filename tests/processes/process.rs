//! The `sluice` binary as a user runs it: `check`, `serve` configured through envoyproxy/
//! ratelimit's environment variables, `query`, `load`, exit codes, and SIGTERM.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{free_port, http, repo, wait_until};

pub(crate) fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    // A clean environment: a stray HOST or PORT must not change what a test runs.
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    c
}

/// A `sluice serve` child, killed when dropped.
pub(crate) struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sluice serve` on free loopback ports, its command given its rules and settings by
/// `configure`, once `/readyz` answers 200: the server, its gRPC port and its HTTP address.
pub(crate) fn serve_ready(configure: impl FnOnce(&mut Command)) -> (Serving, u16, SocketAddr) {
    let (grpc, port) = (free_port(), free_port());
    let mut command = sluice();
    configure(&mut command);
    let server = Serving(
        command
            .arg("serve")
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc.to_string())
            .env("HOST", "127.0.0.1")
            .env("PORT", port.to_string())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(20, "ready", || {
        matches!(http(addr, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
    (server, grpc, addr)
}

#[test]
fn version_names_the_package_version_and_the_commit() {
    let out = sluice().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "sluice {} ({})\n",
        env!("CARGO_PKG_VERSION"),
        sluice::COMMIT
    );
    assert_eq!(text, want);
    assert!(
        sluice::COMMIT.len() == 12 && sluice::COMMIT.bytes().all(|b| b.is_ascii_hexdigit()),
        "a build from a git checkout names its commit: {}",
        sluice::COMMIT
    );
}

#[test]
fn check_accepts_the_example_rules() {
    let out = sluice()
        .arg("check")
        .arg(repo().join("config/rules"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("OK: "));
}

#[test]
fn check_lists_every_error_of_every_file_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    std::fs::write(&a, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: k\n").unwrap();
    std::fs::write(&b, "domain: d\ndescriptors:\n  - key: x\n    bogus: 1\n").unwrap();
    let out = sluice().arg("check").arg(&a).arg(&b).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        format!("{}: invalid rate limit unit 'fortnight'", a.display()),
        format!("{}: duplicate descriptor composite key 'd.k'", a.display()),
        format!(
            "{}: config error, unknown key 'bogus' (line 4, column 5; domain 'd', descriptor path 'x')",
            b.display()
        ),
        format!("{}: duplicate domain 'd' in config file", b.display()),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn check_catches_rules_that_look_right_and_deny_everything() {
    // Issue 19, item 10: a count one level too far out passed `check` ("OK") and became a
    // limit of 0; a misplaced `algorithm` was ignored and `burst` blamed instead.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("edge.yaml");
    std::fs::write(
        &f,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    descriptors:\n      - key: path\n        value: /api\n        rate_limit:\n          unit: minute\n        requests_per_unit: 100\n  - key: user\n    algorithm: token_bucket\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      burst: 30\n  - key: tenant\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 5\n",
    )
    .unwrap();
    let out = sluice().arg("check").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let f = f.display();
    for want in [
        format!("{f}: config error, misplaced key 'requests_per_unit': it belongs inside 'rate_limit', one level further in (line 9, column 9; domain 'edge', descriptor path 'remote_address' > 'path_/api')"),
        format!("{f}: rate_limit of 'edge.remote_address.path_/api' has no requests_per_unit"),
        format!("{f}: config error, misplaced key 'algorithm': it belongs inside 'rate_limit', one level further in (line 11, column 5; domain 'edge', descriptor path 'user')"),
        format!("{f}: invalid rate limit unit 'minutes' (valid: second, minute, hour, day, week, month, year) (line 18, column 7; domain 'edge', descriptor path 'tenant')"),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn check_rejects_windows_too_long_to_count_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("w.yaml");
    std::fs::write(&f, "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: year, unit_multiplier: 4294967295, requests_per_unit: 1}\n").unwrap();
    // A count past u32 is a type error: the file does not decode, so it gets its own file.
    let g = dir.path().join("x.yaml");
    std::fs::write(&g, "domain: x\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n").unwrap();
    let out = sluice().arg("check").arg(&f).arg(&g).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        format!(
            "{}: edge.user: window of 4294967295 years is too long (at most 3650 days, 10 years)",
            f.display()
        ),
        "expected a whole number from 0 to 4294967295".to_string(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn check_accepts_overrides_and_names_their_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok.yaml");
    std::fs::write(&ok, "domain: t\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    overrides:\n      acme: 1000\n      globex: {unit: second, requests_per_unit: 50}\n").unwrap();
    let out = sluice().arg("check").arg(&ok).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // A rule per overridden value, as a descriptor for each would have.
    assert!(
        out.status.success() && text.starts_with("OK: 3 rule(s)"),
        "{text}"
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: t\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    overrides: {beta: 5}\n  - key: plan\n    value: \"pro-*\"\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    overrides:\n      pro-1: {unit: minutes, requests_per_unit: 5}\n      free: 5\n").unwrap();
    let out = sluice().arg("check").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let f = bad.display();
    for want in [
        format!("{f}: overrides need a key-only or wildcard descriptor, but 't.tenant_acme' is for the value 'acme' alone (drop 'value', or make it a pattern with '*') (line 6, column 5;"),
        format!("{f}: invalid rate limit unit 'minutes' (valid: second, minute, hour, day, week, month, year) (line 11, column 15;"),
        format!("{f}: override value 'free' does not match 'pro-*', so it would never apply: 't.plan_pro-*' (line 12, column 7;"),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn check_accepts_token_buckets_and_names_their_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok.yaml");
    std::fs::write(&ok, "domain: b\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 30, algorithm: token_bucket}\n    additional_limits:\n      - {unit: day, requests_per_unit: 10000}\n").unwrap();
    let out = sluice().arg("check").arg(&ok).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.starts_with("OK: "), "{text}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: c\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 30}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, burst: 4}\n").unwrap();
    let out = sluice().arg("check").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        format!(
            "{}: c.a: burst needs algorithm: token_bucket",
            bad.display()
        ),
        format!(
            "{}: invalid algorithm 'leaky' (expected sliding_window, fixed_window, token_bucket or concurrency)",
            bad.display()
        ),
        format!(
            "{}: c.c: burst needs algorithm: token_bucket",
            bad.display()
        ),
    ] {
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn serve_refuses_bad_settings_and_bad_rules() {
    let out = sluice()
        .args(["serve", "--log-format", "xml", "--near-limit-ratio", "7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "EX_USAGE");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("LOG_FORMAT") && err.contains("NEAR_LIMIT_RATIO"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), "domain: \n").unwrap();
    let out = sluice()
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "EX_CONFIG");
    assert!(String::from_utf8_lossy(&out.stderr).contains("config file cannot have empty domain"));
}

#[test]
fn serve_names_every_bad_variable_in_one_run_and_exits_64() {
    let out = sluice()
        .args(["serve", "--grpc-port", "http"])
        .env("REDIS_TIMEOUT", "xyz")
        .env("NEAR_LIMIT_RATIO", "5")
        .env("CACHE_MAX_ENTRIES", "0")
        .env("REDIS_TYPE", "FOO")
        .env("BACKEND_TYPE", "memcache")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "EX_USAGE");
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "GRPC_PORT (--grpc-port): 'http'",
        "REDIS_TIMEOUT (--redis-timeout): 'xyz' is not a duration",
        "NEAR_LIMIT_RATIO (--near-limit-ratio): '5' is not between 0 and 1",
        "CACHE_MAX_ENTRIES (--cache-max-entries): '0' is not at least 1",
        "REDIS_TYPE (--redis-type): 'FOO' is not one of SINGLE, CLUSTER, SENTINEL",
        "BACKEND_TYPE: 'memcache' is refused: only redis is supported",
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    let unknown = sluice().args(["serve", "--no-such-flag"]).output().unwrap();
    assert_eq!(
        unknown.status.code(),
        Some(64),
        "a malformed command line is EX_USAGE too"
    );
}

#[test]
fn help_never_shows_a_secret() {
    for sub in ["serve", "check", "query", "load"] {
        let out = sluice()
            .args([sub, "--help"])
            .env("REDIS_URL", "redis://user:hunter2@redis:6379")
            .env("REDIS_AUTH", "user:hunter2")
            .env("SLUICE_ADDR", "http://user:hunter2@h:1")
            .env("MERGE_DOMAIN_CONFIG", "hunter2")
            .output()
            .unwrap();
        assert!(out.status.success(), "{sub} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            !help.contains("hunter2"),
            "{sub} --help shows a secret:\n{help}"
        );
        if sub == "serve" {
            assert!(help.contains("[env: REDIS_URL]"), "{help}");
        }
    }
}

#[test]
fn serve_with_reference_env_then_query_load_and_sigterm() {
    let root = tempfile::tempdir().unwrap();
    write_rules_in_the_reference_layout(root.path());
    let (grpc, port) = (free_port(), free_port());
    let mut child = serve_with_reference_env(root.path(), grpc, port);
    check_ready_with_the_rules(port);

    let addr = format!("http://127.0.0.1:{grpc}");
    check_query_counts_and_says_over_limit(&addr);
    check_load_reports_its_rate(&addr);

    let log = sigterm_with_an_idle_connection_then_log(&mut child, grpc);
    check_serve_log(&log, grpc, port);
}

/// envoyproxy/ratelimit's layout: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY; a
/// file it reads, with a `shadow_mode` out of place (ignored) and a trailing `---`.
fn write_rules_in_the_reference_layout(root: &Path) {
    let rules = root.join("ratelimit/config");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("r.yaml"),
        "domain: load\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2, algorithm: fixed_window, shadow_mode: true}\n---\n",
    )
    .unwrap();
}

/// `sluice serve` configured only through the reference's environment variables.
fn serve_with_reference_env(root: &Path, grpc: u16, port: u16) -> Child {
    sluice()
        .arg("serve")
        .env("RUNTIME_ROOT", root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("SHUTDOWN_GRACE", "5s")
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        // The reference's variables sluice has no use for: one warns, one means what sluice
        // does anyway.
        .env("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")
        .env("USE_STATSD", "false")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Ready on /readyz, with the rules read from the reference's layout on /rlconfig.
fn check_ready_with_the_rules(port: u16) {
    let http_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(20, "ready", || {
        matches!(http(http_addr, "GET", "/readyz", "", &[]), Ok((200, ..)))
    });
    let (_, _, rl) = http(http_addr, "GET", "/rlconfig", "", &[]).unwrap();
    assert!(
        rl.contains("load.user: unit=DAY requests_per_unit=2"),
        "{rl}"
    );
}

/// `sluice query` against the limit of 2 a day: a check, two hits, then over the limit
/// with the response headers.
fn check_query_counts_and_says_over_limit(addr: &str) {
    let query_with = |flags: &[&str]| {
        let out = sluice()
            .args(["query", "--addr", addr, "--domain", "load", "user=q"])
            .args(flags)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let query = || query_with(&[]);
    // `--hits 0` is the descriptor's own hits_addend: a check that counts nothing (the
    // request-level 0 would count 1), so both hits of the limit are still there after it.
    let check = query_with(&["--hits", "0"]);
    assert_eq!(check["overallCode"], "OK");
    assert_eq!(check["statuses"][0]["limitRemaining"], 2, "{check}");
    assert_eq!(query()["overallCode"], "OK");
    assert_eq!(query()["responseHeadersToAdd"][1]["value"], "0");
    let over = query();
    assert_eq!(over["overallCode"], "OVER_LIMIT");
    assert_eq!(over["responseHeadersToAdd"][3]["key"], "Retry-After");
}

/// `sluice load` for a second: its summary line has a rate, the ok count and p99.
fn check_load_reports_its_rate(addr: &str) {
    let out = sluice()
        .args([
            "load",
            "--addr",
            addr,
            "--domain",
            "load",
            "--values",
            "50",
            "--concurrency",
            "4",
            "--duration",
            "1s",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("req/s (ok ") && text.contains("p99"),
        "{text}"
    );
    let total: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(total > 0, "{text}");
}

/// SIGTERM with an idle client connection open: the process drains and exits cleanly,
/// well within its grace period. Returns what it logged.
pub(crate) fn sigterm_with_an_idle_connection_then_log(child: &mut Child, grpc: u16) -> String {
    let _idle = std::net::TcpStream::connect(("127.0.0.1", grpc)).unwrap();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut waited = Duration::ZERO;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            waited < Duration::from_secs(15),
            "sluice did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
        waited += Duration::from_millis(50);
    };
    assert!(status.success(), "exit status {status:?}");
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    log
}

/// The log tells of the signal and the stop, the addresses, the reference's variable that
/// has no effect (not the one that means what sluice does anyway), the key out of place.
fn check_serve_log(log: &str, grpc: u16, port: u16) {
    assert!(log.contains("SIGTERM") && log.contains("stopped"), "{log}");
    // The listen addresses as a user writes them, not `Some(127.0.0.1:…)`.
    assert!(
        log.contains(&format!("grpc=127.0.0.1:{grpc} http=127.0.0.1:{port}")),
        "{log}"
    );
    assert!(
        log.contains("LOCAL_CACHE_SIZE_IN_BYTES is set but has no effect in sluice"),
        "{log}"
    );
    assert!(!log.contains("USE_STATSD"), "{log}");
    assert!(
        log.contains("misplaced key 'shadow_mode' is ignored, as envoyproxy/ratelimit ignores it: it belongs in the descriptor, beside 'rate_limit', one level further out (line 4, column"),
        "{log}"
    );
}

#[test]
fn query_with_no_server_says_that_none_is_listening() {
    // A port nothing listens on: what a user meets who ran `query` before `serve` was up.
    let addr = format!("http://127.0.0.1:{}", free_port());
    let out = sluice()
        .args(["query", "--addr", &addr, "--domain", "d", "k=v"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("no server is listening at {addr}"))
            && err.contains("Is `sluice serve` running?")
            && err.contains("onnection refused"),
        "{err}"
    );
}
