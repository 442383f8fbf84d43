//! Reaching a protected Redis: ACL users, passwords (right, wrong, kept out of logs and
//! endpoints), TLS, client certificates (standalone, Cluster, Sentinel, missing), and
//! hostname verification skipped but the chain still verified.

use std::process::Command;
use std::time::Duration;

use super::{counters, parts, RULES};
use crate::common::procs::{query, spawn_sluice, wait_live, Proc};
use crate::common::redis::{RedisCluster, RedisServer, RedisTls};
use crate::common::{free_port, http, wait_until};

#[test]
fn an_acl_user_authenticates_with_user_and_password() {
    // The default user is off, so only alice's credentials get in.
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "off",
        "--user",
        "alice",
        "on",
        ">alice-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let port = redis.port();
    // As REDIS_AUTH=user:password, and as credentials in the URL.
    let via_env = spawn_sluice(
        dir.path(),
        &redis.url(),
        &[("REDIS_AUTH", "alice:alice-pw")],
    );
    let in_url = spawn_sluice(
        dir.path(),
        &format!("redis://alice:alice-pw@127.0.0.1:{port}"),
        &[],
    );
    query(&via_env, "acl");
    query(&in_url, "acl");
    let as_alice = |args: &[&str]| {
        let mut c = redis.cli_command();
        c.args(["--user", "alice", "--pass", "alice-pw", "--no-auth-warning"])
            .args(args);
        String::from_utf8(c.output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string()
    };
    wait_until(30, "both replicas' hits in Redis", || {
        let keys = as_alice(&["--scan"]);
        keys.lines().any(|k| parts(&as_alice(&["HVALS", k])) == 2)
    });
    for p in [&via_env, &in_url] {
        let (_, _, ready) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
        assert!(
            ready.contains(": ok") && !ready.contains("alice-pw"),
            "{ready}"
        );
    }
}

#[test]
fn tls_and_auth_work_and_the_secret_stays_out_of_logs_and_endpoints() {
    const SECRET: &str = "s3cret-Pw";
    let tls = RedisTls::start_with(&["--requirepass", SECRET]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let ca = tls.ca_cert.display().to_string();
    let p = spawn_sluice(
        dir.path(),
        &format!("127.0.0.1:{}", tls.port()),
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", SECRET),
            ("SSL_CERT_FILE", &ca),
        ],
    );
    for _ in 0..4 {
        assert_eq!(query(&p, "tls")["overallCode"], "OK");
    }
    let mut p = p;
    wait_until(30, "the hits to reach Redis over TLS", || {
        let keys = tls.cli(&["--scan", "--pattern", "*sluice:v2:{*"]);
        keys.lines()
            .map(|k| parts(&tls.cli(&["HVALS", k])))
            .sum::<u64>()
            == 4
    });
    for path in ["/readyz", "/metrics", "/rlconfig", "/rlconfig/status"] {
        let (_, _, body) = http(p.http, "GET", path, "", &[]).unwrap();
        assert!(!body.contains(SECRET), "{path} shows the Redis password");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    wait_until(15, "sluice exit", || p.child.try_wait().unwrap().is_some());
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(log.contains("global mode"), "debug log written: {log}");
    assert!(!log.contains(SECRET), "the log shows the Redis password");
}

/// Waits until the process's `/readyz` names a degraded shard.
fn wait_degraded(p: &Proc) {
    wait_until(30, "the shard to be degraded", || {
        http(p.http, "GET", "/readyz", "", &[])
            .unwrap()
            .2
            .contains("degraded")
    });
}

#[test]
fn a_wrong_password_keeps_the_shard_degraded_but_the_service_answering() {
    let redis = RedisServer::start_with(&["--requirepass", "right"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let p = spawn_sluice(dir.path(), &redis.url(), &[("REDIS_AUTH", "wrong")]);
    assert_eq!(query(&p, "x")["overallCode"], "OK");
    wait_degraded(&p);
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("wrong"), "{body}");
}

/// `REDIS_TLS_*` as Envoy Gateway sets them for a Redis backend with a TLS certificateRef:
/// a client certificate to a Redis that requires one, verified against a CA of its own (not
/// the system's roots: the process has no SSL_CERT_FILE). The per-second Redis, on the same
/// server here, gets them too: its shard hears the heartbeats, so it would be degraded
/// without them.
const MTLS_RULES: &str = "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}\n  - key: e\n    rate_limit: {unit: minute, requests_per_unit: 2, exact: true}\n";

/// Three hits on the exact rule `e` of `MTLS_RULES`: the overall codes.
fn exact_hits(p: &Proc) -> Vec<String> {
    let body = r#"{"domain":"g","descriptors":[{"entries":[{"key":"e","value":"x"}]}]}"#;
    (0..3)
        .map(|_| {
            let (_, _, text) = http(p.http, "POST", "/json", body, &[]).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["overallCode"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

#[test]
fn a_client_certificate_and_a_ca_of_its_own_reach_a_redis_that_requires_them() {
    let tls = RedisTls::start_mtls(&[]);
    let (cert, key) = tls.client.clone().expect("mtls client certificate");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let ca = tls.ca_cert.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), MTLS_RULES).unwrap();
    let addr = format!("127.0.0.1:{}", tls.port());
    let mut p = spawn_sluice(
        dir.path(),
        &addr,
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("REDIS_TLS_CACERT", &ca),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &addr),
            ("REDIS_PERSECOND_TLS", "true"),
        ],
    );
    for _ in 0..4 {
        assert_eq!(query(&p, "mtls")["overallCode"], "OK");
    }
    wait_until(30, "the hits to reach Redis over mTLS", || {
        counters(&tls.server).0 == 4
    });
    wait_live(&p, 1);
    // Both shards up: a first call may time out on a busy machine (a TLS handshake in a
    // debug build), and the shard answers at its next probe.
    wait_until(
        30,
        "both shards to be up",
        || matches!(http(p.http, "GET", "/readyz", "", &[]), Ok((200, _, body)) if !body.contains("degraded")),
    );
    // The exact path: its own pool, the same certificates; its count is in Redis.
    assert_eq!(exact_hits(&p), ["OK", "OK", "OVER_LIMIT"]);
    assert!(
        tls.cli(&["--scan", "--pattern", "*sluice:x:{*"])
            .lines()
            .count()
            >= 1,
        "the exact rule's counter is in Redis"
    );
    let pem = std::fs::read_to_string(&key).unwrap();
    let secret = pem.lines().nth(1).expect("a PEM body line");
    let _ = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status();
    wait_until(15, "sluice exit", || p.child.try_wait().unwrap().is_some());
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(!log.contains(secret), "the log shows the client key");
}

/// The same server without a client certificate (the CA alone): the handshake is refused,
/// the shard is degraded in /readyz, decisions go on from memory and nothing is written.
#[test]
fn without_the_client_certificate_the_shard_is_degraded_and_nothing_is_written() {
    let tls = RedisTls::start_mtls(&[]);
    let ca = tls.ca_cert.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let p = spawn_sluice(
        dir.path(),
        &format!("127.0.0.1:{}", tls.port()),
        &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)],
    );
    for _ in 0..3 {
        assert_eq!(query(&p, "nocert")["overallCode"], "OK");
    }
    wait_degraded(&p);
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(counters(&tls.server), (0, vec![]), "nothing reached Redis");
}

/// A client certificate file that is not there stops the start with an error naming the
/// variable and the file.
#[test]
fn a_missing_redis_client_certificate_stops_the_start_naming_it() {
    let tls = RedisTls::start_mtls(&[]);
    let (_, key) = tls.client.clone().expect("mtls client certificate");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let missing = dir.path().join("redis-certs").join("tls.crt");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .env_clear()
        .args(["serve", "--config"])
        .arg(dir.path())
        .args([
            "--grpc-addr",
            &format!("127.0.0.1:{}", free_port()),
            "--http-addr",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .env("REDIS_URL", format!("127.0.0.1:{}", tls.port()))
        .env("REDIS_TLS", "true")
        .env("REDIS_TLS_CLIENT_CERT", &missing)
        .env("REDIS_TLS_CLIENT_KEY", &key)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "sluice started without its certificate"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("REDIS_TLS_CLIENT_CERT"))
        .unwrap_or_else(|| panic!("no error names REDIS_TLS_CLIENT_CERT: {stderr}"));
    assert!(line.contains(&missing.display().to_string()), "{line}");
}

/// 4 hits on `value` (a synced rule) reach `server`, an exact rule counts there too, and no
/// shard is degraded: the mTLS tests' common proof that the certificates got everywhere.
fn counts_reach(p: &Proc, value: &str, server: &RedisServer) {
    for _ in 0..4 {
        assert_eq!(query(p, value)["overallCode"], "OK");
    }
    wait_until(30, "the hits to reach Redis over mTLS", || {
        counters(server).0 == 4
    });
    assert_eq!(exact_hits(p), ["OK", "OK", "OVER_LIMIT"]);
    let exact_keys = server.cli(&["--scan", "--pattern", "*sluice:x:{*"]);
    assert!(
        exact_keys.lines().count() >= 1,
        "the exact rule's counter is in Redis"
    );
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("degraded"), "{body}");
}

/// A Redis Cluster over TLS that requires client certificates: the cluster client gets the
/// certificate and CA too (for the nodes CLUSTER SLOTS names), in the sync and exact paths.
#[test]
fn a_tls_cluster_takes_the_client_certificate_and_ca() {
    let cluster = RedisCluster::start_one_mtls();
    let (ca, client) = cluster.nodes[0].tls_files().expect("a TLS node");
    let (cert, key) = client.expect("a client certificate");
    let s = |p: &std::path::Path| p.display().to_string();
    let (ca, cert, key) = (s(&ca), s(&cert), s(&key));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), MTLS_RULES).unwrap();
    let p = spawn_sluice(
        dir.path(),
        &format!("127.0.0.1:{}", cluster.nodes[0].port()),
        &[
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("REDIS_TLS_CACERT", &ca),
        ],
    );
    counts_reach(&p, "cluster-mtls", &cluster.nodes[0]);
}

/// Sentinel over TLS, every server requiring client certificates: the sentinels and the
/// master they name both get the certificate and CA, in the sync and exact paths.
#[test]
fn tls_sentinels_and_their_master_take_the_client_certificate_and_ca() {
    let master = RedisTls::start_mtls(&[]);
    let sentinel = RedisServer::start_sentinel_tls("m", &master.server);
    let (cert, key) = master.client.clone().expect("a client certificate");
    let s = |p: &std::path::Path| p.display().to_string();
    let (ca, cert, key) = (s(&master.ca_cert), s(&cert), s(&key));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), MTLS_RULES).unwrap();
    let p = spawn_sluice(
        dir.path(),
        &format!("m,127.0.0.1:{}", sentinel.port()),
        &[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
            ("REDIS_TLS_CACERT", &ca),
            // The exact path's first call asks a Sentinel, then opens a TLS connection to the
            // master, each with a handshake: on two busy cores past the 100 ms default, and
            // the request is then decided on the prior (this tests the certificates, not the
            // latency).
            ("REDIS_TIMEOUT", "2s"),
        ],
    );
    counts_reach(&p, "sentinel-mtls", &master.server);
}

/// A Redis whose certificate names another host: refused (degraded, nothing written) until
/// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, which still verifies the chain: with another CA the
/// shard stays degraded.
#[test]
fn skipping_hostname_verification_still_verifies_the_chain() {
    let tls = RedisTls::start_named("DNS:redis.invalid");
    let other = RedisTls::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let addr = format!("127.0.0.1:{}", tls.port());
    let run = |ca: &std::path::Path, skip: &str| {
        let ca = ca.display().to_string();
        spawn_sluice(
            dir.path(),
            &addr,
            &[
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CACERT", &ca),
                ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", skip),
            ],
        )
    };
    let degraded = |p: &Proc| {
        assert_eq!(query(p, "named")["overallCode"], "OK");
        wait_degraded(p);
    };
    // The name is checked by default.
    degraded(&run(&tls.ca_cert, "false"));
    // Skipping the name does not skip the chain: another CA is still refused.
    degraded(&run(&other.ca_cert, "true"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counters(&tls.server).0, 0, "nothing written while refused");
    let p = run(&tls.ca_cert, "true");
    for _ in 0..3 {
        assert_eq!(query(&p, "named")["overallCode"], "OK");
    }
    wait_until(30, "the hits to reach Redis despite the name", || {
        counters(&tls.server).0 >= 3
    });
}
