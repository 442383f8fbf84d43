//! Tests of the Redis test harness itself (tests/common/redis/): real redis-server processes
//! on free loopback ports, standalone, with auth, over TLS, and as a cluster.
use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::process::{Command, Stdio};

use crate::common::redis::*;

fn assert_refused(port: u16) {
    match TcpStream::connect(("127.0.0.1", port)) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "port {port}: {e}"),
        Ok(_) => panic!("port {port} still accepts connections"),
    }
}

#[test]
fn start_set_get() {
    let server = RedisServer::start();
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["SET", "greeting", "hello"]), "OK");
    assert_eq!(server.cli(&["GET", "greeting"]), "hello");
    assert_eq!(server.get("greeting").as_deref(), Some("hello"));
    assert_eq!(get(&server, "missing"), None);
    // Values survive the trip through redis-cli's quoting.
    server.cli(&["SET", "empty", ""]);
    assert_eq!(server.get("empty").as_deref(), Some(""));
    let odd = "a \"quoted\"\nline\twith \\ and é";
    server.cli(&["SET", "odd", odd]);
    assert_eq!(server.get("odd").as_deref(), Some(odd));
    assert_eq!(server.cli(&["INCRBY", "n", "5"]), "5");
    // An error reply fails try_cli (redis-cli -e).
    let err = server.try_cli(&["INCR", "greeting"]).unwrap_err();
    assert!(err.contains("not an integer"), "{err}");

    // No persistence, loopback only, dir in the tempdir.
    assert_eq!(
        server
            .cli(&["CONFIG", "GET", "save"])
            .lines()
            .collect::<Vec<_>>(),
        ["save"]
    );
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]),
        "appendonly\nno"
    );
    assert_eq!(server.cli(&["CONFIG", "GET", "bind"]), "bind\n127.0.0.1");
    let dir = server.cli(&["CONFIG", "GET", "dir"]);
    assert_eq!(
        dir.lines().nth(1).map(std::path::Path::new),
        Some(server.dir())
    );
    assert!(server.log().contains("Ready to accept connections"));
}

#[test]
fn kill_refuses_connections_and_restart_serves_the_same_port_empty() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.cli(&["SET", "k", "v"]);
    assert!(server.is_running());

    server.kill();
    assert!(!server.is_running());
    assert_refused(port);
    assert!(server.try_cli(&["PING"]).is_err());
    server.kill(); // idempotent

    server.restart();
    assert_eq!(server.port(), port);
    assert!(server.is_running());
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(
        server.get("k"),
        None,
        "no persistence: data is gone after a restart"
    );

    // restart() on a running server kills it first.
    server.cli(&["SET", "k", "again"]);
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.get("k"), None);
}

#[test]
fn dropping_the_handle_kills_the_server() {
    let server = RedisServer::start();
    let port = server.port();
    let dir = server.dir().to_path_buf();
    assert_eq!(server.cli(&["PING"]), "PONG");
    drop(server);
    assert_refused(port);
    assert!(!dir.exists(), "tempdir removed");
}

#[test]
fn parallel_starts_get_distinct_ports() {
    let servers: Vec<RedisServer> = std::thread::scope(|s| {
        (0..4)
            .map(|_| s.spawn(RedisServer::start))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    });
    let ports: HashSet<u16> = servers.iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 4);
    for (i, server) in servers.iter().enumerate() {
        server.cli(&["SET", "who", &i.to_string()]);
    }
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(
            server.get("who"),
            Some(i.to_string()),
            "servers are independent"
        );
    }
}

#[test]
fn requirepass_is_used_by_cli() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    assert_eq!(server.password(), Some("s3cret"));
    assert_eq!(server.cli(&["PING"]), "PONG");
    assert_eq!(server.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(server.get("k").as_deref(), Some("v"));

    // Without credentials the server refuses.
    let reply = resp_command(server.addr(), &["GET", "k"]).expect("a reply");
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    // With a wrong password too.
    let out = Command::new(require("redis-cli"))
        .args([
            "-e",
            "-p",
            &server.port().to_string(),
            "--pass",
            "wrong",
            "--no-auth-warning",
            "GET",
            "k",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
}

#[test]
fn acl_user_via_set_cli_auth() {
    let mut server = RedisServer::start_with(&[
        "--user", "default", "off", "--user", "alice", "on", ">pw", "~*", "+@all",
    ]);
    let err = server.try_cli(&["PING"]).unwrap_err();
    assert!(err.contains("NOAUTH"), "{err}");
    server.set_cli_auth(Some("alice"), Some("pw"));
    assert_eq!(server.cli(&["ACL", "WHOAMI"]), "alice");
    assert_eq!(server.cli(&["SET", "k", "v"]), "OK");
    // Restart keeps the arguments (and so the users).
    server.restart();
    assert_eq!(server.cli(&["ACL", "WHOAMI"]), "alice");
}

#[test]
fn tls_server_answers_over_tls_only() {
    let tls = RedisTls::start();
    let port = tls.port();
    assert_eq!(tls.url(), format!("rediss://127.0.0.1:{port}"));
    assert!(std::fs::read_to_string(&tls.ca_cert)
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    assert_eq!(tls.cli(&["PING"]), "PONG");
    tls.cli(&["SET", "k", "over tls"]);
    assert_eq!(tls.server.get("k").as_deref(), Some("over tls"));
    assert_eq!(
        tls.server.cli(&["CONFIG", "GET", "port"]),
        "port\n0",
        "no plain listener"
    );

    // Plain RESP on the TLS port gets no answer.
    assert_ne!(
        resp_command(tls.server.addr(), &["PING"]).as_deref(),
        Some("+PONG")
    );
    let plain = Command::new(require("redis-cli"))
        .args(["-e", "-p", &port.to_string(), "PING"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !plain.status.success(),
        "plain redis-cli must fail: {plain:?}"
    );

    // The certificate chain verifies for 127.0.0.1 and localhost (what real clients check),
    // and not for another name.
    let s_client = |check: &[&str]| {
        Command::new(require("openssl"))
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{port}"),
                "-verify_return_error",
                "-CAfile",
            ])
            .arg(&tls.ca_cert)
            .args(check)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    for check in [
        &["-verify_ip", "127.0.0.1"][..],
        &["-verify_hostname", "localhost", "-servername", "localhost"],
    ] {
        let out = s_client(check);
        assert!(
            out.status.success(),
            "{check:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!s_client(&["-verify_hostname", "not-this-host.example"])
        .status
        .success());

    // restart keeps TLS.
    let mut tls = tls;
    tls.server.restart();
    assert_eq!(tls.port(), port);
    assert_eq!(tls.cli(&["PING"]), "PONG");
}

#[test]
fn cluster_of_three_masters_routes_keys_by_slot() {
    let mut cluster = RedisCluster::start(3);
    assert_eq!(cluster.nodes.len(), 3);
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port()).collect();
    assert_eq!(
        cluster.seed_urls(),
        ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
    );
    for node in &cluster.nodes {
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
    }

    let mut owners = HashSet::new();
    for i in 0..24 {
        let (key, value) = (format!("key:{i}"), format!("value {i}"));
        assert!(cluster.cli(&["SET", &key, &value]).ends_with("OK"));
        let owner = cluster.node_for_key(&key);
        owners.insert(owner);
        // A plain (non-cluster) GET on the owner finds it; the others redirect.
        assert_eq!(
            cluster.node(owner).get(&key).as_deref(),
            Some(value.as_str()),
            "{key}"
        );
        for other in cluster.nodes.iter().filter(|n| n.port() != owner) {
            let err = other.try_cli(&["GET", &key]).unwrap_err();
            assert!(err.contains("MOVED"), "{key} on {}: {err}", other.port());
        }
        assert_eq!(cluster.get(&key).as_deref(), Some(value.as_str()));
    }
    assert_eq!(owners.len(), 3, "24 keys spread over all three masters");
    assert_eq!(cluster.get("never-set"), None);

    // Keys with the same hash tag share a slot, hence a node: multi-key commands work there.
    let tagged = ["{x}a", "{x}b", "{x}:counter:123"];
    let owner = cluster.node_for_key("x");
    for (i, key) in tagged.iter().enumerate() {
        assert_eq!(cluster.slot(key), cluster.slot("x"));
        assert_eq!(cluster.node_for_key(key), owner);
        cluster.cli(&["SET", key, &i.to_string()]);
    }
    let mut mget = vec!["MGET"];
    mget.extend(tagged);
    assert_eq!(cluster.node(owner).cli(&mget), "0\n1\n2");

    // A node killed and restarted comes back on its port with its slots (nodes.conf) but no data.
    let idx = cluster
        .nodes
        .iter()
        .position(|n| n.port() == owner)
        .unwrap();
    cluster.nodes[idx].kill();
    assert_refused(owner);
    cluster.nodes[idx].restart();
    cluster.wait_ok();
    assert_eq!(cluster.node_for_key("x"), owner);
    assert_eq!(cluster.get("{x}a"), None);
}

#[test]
fn cluster_of_one_master_is_joined_by_hand() {
    let cluster = RedisCluster::start(1);
    let port = cluster.nodes[0].port();
    for key in ["a", "b", "{x}y"] {
        assert_eq!(cluster.node_for_key(key), port);
        cluster.cli(&["SET", key, key]);
        assert_eq!(cluster.nodes[0].get(key).as_deref(), Some(key));
    }
}

#[test]
fn require_finds_installed_tools() {
    assert!(require("redis-server").ends_with("redis-server"));
    assert!(require("redis-cli").ends_with("redis-cli"));
    assert!(require("openssl").ends_with("openssl"));
}

#[test]
#[should_panic(expected = "`sluice-no-such-tool` is not on PATH")]
fn require_panics_for_a_missing_binary() {
    require("sluice-no-such-tool");
}

#[test]
#[should_panic(
    expected = "SLUICE_TEST_REDIS_SERVER=sluice-no-such-server asks the tests to run against `sluice-no-such-server`, which is not an executable on PATH"
)]
fn a_missing_server_asked_for_fails_clearly() {
    server_binary_for(Some("sluice-no-such-server"));
}

#[test]
#[should_panic(expected = "which is not an executable file")]
fn a_missing_server_path_asked_for_fails_clearly() {
    server_binary_for(Some("/nonexistent/valkey-server"));
}

#[test]
fn no_server_asked_for_means_redis_server() {
    assert_eq!(server_binary_for(None), require("redis-server"));
    assert_eq!(server_binary_for(Some("")), require("redis-server"));
}

/// The server the harness starts is the binary SLUICE_TEST_REDIS_SERVER asks for (Valkey's
/// pass of scripts/test.sh runs this test too): the version it reports over the wire is the
/// one its binary prints, and a Valkey answers as Valkey.
#[test]
fn started_server_is_the_one_asked_for() {
    let bin = server_binary();
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", bin.display()));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let version = printed
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("no v=VERSION in {printed:?}"))
        .to_string();
    let server = RedisServer::start();
    let info = server.cli(&["INFO", "server"]);
    let valkey = printed.starts_with("Valkey");
    let field = if valkey {
        "valkey_version"
    } else {
        "redis_version"
    };
    assert!(
        info.lines()
            .any(|l| l.trim() == format!("{field}:{version}")),
        "{} prints {printed:?}, but the started server's INFO has no {field}:{version}:\n{info}",
        bin.display()
    );
    assert_eq!(
        info.contains("valkey_version:"),
        valkey,
        "{} prints {printed:?}; INFO:\n{info}",
        bin.display()
    );
}
