//! The image swap: sluice's binary run as `/bin/ratelimit` with no arguments and exactly the
//! environment Envoy Gateway gives envoyproxy/ratelimit's Deployment (its
//! `internal/infrastructure/kubernetes/ratelimit/resource.go`): rules over xDS with mTLS to the
//! management server, gRPC over TLS, Redis, the reference's Prometheus names, the runtime
//! directory variables it no longer reads. Only the listen ports are added (free ones instead
//! of 8080/8081) and the files' paths are the test's.

mod common;

use std::net::SocketAddr;

use common::certs;
use common::procs::Proc;
use common::redis::RedisServer;
use common::xds::{config, AdsServer};
use common::{desc, free_port, http_async, wait_until_async};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit::Minute;

/// One ShouldRateLimit over a new TLS connection that trusts `ca`: the overall code.
async fn call_tls(addr: SocketAddr, ca: &std::path::Path) -> i32 {
    let req = RateLimitRequest {
        domain: "x".into(),
        descriptors: vec![desc(&[("k", "v")])],
        hits_addend: 0,
    };
    certs::should_rate_limit_tls(addr, certs::client_config(ca, None), req)
        .await
        .expect("ShouldRateLimit over TLS")
        .overall_code
}

#[tokio::test]
async fn envoy_gateways_ratelimit_deployment_runs_sluice_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let ca = certs::ca(dir.path(), "ca");
    // Envoy Gateway mounts one Secret at /certs: the same pair serves gRPC and is the xDS
    // client's identity.
    let pair = certs::leaf(
        dir.path(),
        "tls",
        &ca,
        "serverAuth,clientAuth",
        "DNS:localhost,IP:127.0.0.1",
    );
    let xds_server = certs::server(dir.path(), "xds", &ca);
    let ads = AdsServer::start_tls(
        sluice::server::tls::GrpcTls {
            cert: xds_server.cert,
            key: xds_server.key,
            client_ca: Some(ca.cert.clone()),
            client_san: None,
        },
        None,
    )
    .await;
    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    let redis = RedisServer::start();
    let redis_url = redis.url().trim_start_matches("redis://").to_string();

    // `/bin/ratelimit`: a link to the binary under the reference's name.
    let bin = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &bin).unwrap();
    let (grpc_port, http_port, prom_port) = (free_port(), free_port(), free_port());
    let http: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(&bin)
        .env_clear()
        .envs([
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &ads.addr.to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &path(&pair.cert)),
            ("GRPC_SERVER_TLS_KEY", &path(&pair.key)),
            // Not a variable the reference reads; Envoy Gateway sets it anyway.
            ("GRPC_SERVER_TLS_CA_CERT", &path(&ca.cert)),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &path(&pair.cert)),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &path(&pair.key)),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &path(&ca.cert)),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &format!(":{prom_port}")),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
            // Added: free ports instead of the defaults 8081 and 8080.
            ("GRPC_PORT", &grpc_port.to_string()),
            ("PORT", &http_port.to_string()),
        ])
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let proc = Proc { child, http, log };
    let logged = || std::fs::read_to_string(proc.log.path()).unwrap_or_default();

    // Envoy Gateway's probes: /healthcheck on the HTTP port.
    wait_until_async(30, "/healthcheck to answer 200", || async {
        matches!(
            http_async(http, "GET", "/healthcheck", "").await,
            Ok((200, _, _))
        )
    })
    .await;
    // Ready before the first rules (FORCE_START_WITHOUT_INITIAL_CONFIG): the ADS stream may
    // still be opening.
    wait_until_async(30, "the ADS stream's first request", || async {
        !ads.requests().is_empty()
    })
    .await;
    let node = ads.requests()[0].node.clone().unwrap();
    assert_eq!(node.id, "envoy-ratelimit");
    // The rules came over mTLS; gRPC answers over TLS and enforces them.
    wait_until_async(30, "the xDS rules to be in force", || async {
        matches!(
            http_async(http, "GET", "/rlconfig", "").await,
            Ok((200, _, body)) if body.contains("x.k")
        )
    })
    .await;
    assert_eq!(call_tls(grpc, &ca.cert).await, 1, "OK\n{}", logged());
    assert_eq!(call_tls(grpc, &ca.cert).await, 2, "OVER_LIMIT");
    // Both hits reach Redis in the background (a counter hash, one field a replica).
    wait_until_async(30, "the counts to reach Redis", || async {
        let keys = redis.cli(&["--scan", "--pattern", "*sluice:v2:{*"]);
        keys.lines().any(|k| {
            let sum: i64 = redis
                .cli(&["HVALS", k])
                .lines()
                .filter_map(|v| v.trim().parse::<i64>().ok())
                .sum();
            sum == 2
        })
    })
    .await;
    // The reference's Prometheus names on PROMETHEUS_ADDR.
    let (status, _, text) = http_async(prom, "GET", "/metrics", "").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_over_limit{domain="x",key1="k"} 1"#),
        "{text}"
    );
    // What sluice does not read is said at start, not silently dropped.
    assert!(logged().contains("PROMETHEUS_MAPPER_YAML"), "{}", logged());
}
