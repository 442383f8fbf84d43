//! The image swap: sluice's binary run as `/bin/ratelimit` with no arguments and exactly the
//! environment Envoy Gateway gives envoyproxy/ratelimit's Deployment (its
//! `internal/infrastructure/kubernetes/ratelimit/resource.go`): rules over xDS with mTLS to the
//! management server, gRPC over TLS, Redis, the reference's Prometheus names, the runtime
//! directory variables it no longer reads. Only the listen ports are added (free ones instead
//! of 8080/8081) and the files' paths are the test's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::common::certs;
use crate::common::procs::Proc;
use crate::common::redis::RedisServer;
use crate::common::tls_client;
use crate::common::xds::{config, AdsServer};
use crate::common::{desc, free_port, http_async, wait_until_async};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit::Minute;

/// One ShouldRateLimit over a new TLS connection that trusts `ca`: the overall code.
async fn call_tls(addr: SocketAddr, ca: &Path) -> i32 {
    let req = RateLimitRequest {
        domain: "x".into(),
        descriptors: vec![desc(&[("k", "v")])],
        hits_addend: 0,
    };
    tls_client::should_rate_limit_tls(addr, tls_client::client_config(ca, None), req)
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
    let ads = start_xds_over_mtls(dir.path(), &ca).await;
    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    let redis = RedisServer::start();
    let redis_url = redis.url().trim_start_matches("redis://").to_string();

    let bin = link_as_bin_ratelimit(dir.path());
    let (grpc_port, http_port, prom_port) = (free_port(), free_port(), free_port());
    let http: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let proc = spawn_with_gateways_env(
        &bin,
        (grpc_port, http, prom_port),
        &ads,
        &pair,
        &ca,
        &redis_url,
    );
    let logged = || std::fs::read_to_string(proc.log.path()).unwrap_or_default();

    wait_for_health_and_the_xds_rules(http, &ads).await;
    assert_eq!(call_tls(grpc, &ca.cert).await, 1, "OK\n{}", logged());
    assert_eq!(call_tls(grpc, &ca.cert).await, 2, "OVER_LIMIT");
    wait_for_the_hit_in_redis(&redis).await;
    check_the_references_metric_names(prom).await;
    // What sluice does not read is said at start, not silently dropped.
    assert!(logged().contains("PROMETHEUS_MAPPER_YAML"), "{}", logged());
}

/// The xDS management server, which asks for the client certificate `ca` signed.
async fn start_xds_over_mtls(dir: &Path, ca: &certs::Pair) -> AdsServer {
    let xds_server = certs::server(dir, "xds", ca);
    AdsServer::start_tls(
        sluice::server::tls::GrpcTls {
            cert: xds_server.cert,
            key: xds_server.key,
            client_ca: Some(ca.cert.clone()),
            client_san: None,
        },
        None,
    )
    .await
}

/// `/bin/ratelimit`: a link to the binary under the reference's name.
fn link_as_bin_ratelimit(dir: &Path) -> PathBuf {
    let bin = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &bin).unwrap();
    bin
}

/// `bin` run with no arguments and Envoy Gateway's environment, plus the free ports (gRPC,
/// HTTP and Prometheus) instead of the defaults.
fn spawn_with_gateways_env(
    bin: &Path,
    (grpc_port, http, prom_port): (u16, SocketAddr, u16),
    ads: &AdsServer,
    pair: &certs::Pair,
    ca: &certs::Pair,
    redis_url: &str,
) -> Proc {
    let http_port = http.port();
    let path = |p: &Path| p.display().to_string();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(bin)
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
            ("REDIS_URL", redis_url),
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
    Proc { child, http, log }
}

/// Envoy Gateway's probes (/healthcheck on the HTTP port) answer, the ADS stream opens and
/// the rules it brings over mTLS are in force.
async fn wait_for_health_and_the_xds_rules(http: SocketAddr, ads: &AdsServer) {
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
}

/// Both hits reach Redis in the background (a counter hash, one field a replica).
async fn wait_for_the_hit_in_redis(redis: &RedisServer) {
    // A limit of 1 a minute is under `EXACT_BELOW`: decided in Redis on the request path,
    // which counts the admitted hit, once, in its exact key (docs/global.md, "Small limits").
    wait_until_async(30, "the count to reach Redis", || async {
        let keys = redis.cli(&["--scan", "--pattern", "*sluice:x:{*"]);
        keys.lines().any(|k| redis.cli(&["GET", k]).trim() == "1")
    })
    .await;
}

/// The reference's Prometheus names on PROMETHEUS_ADDR.
async fn check_the_references_metric_names(prom: SocketAddr) {
    let (status, _, text) = http_async(prom, "GET", "/metrics", "").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_over_limit{domain="x",key1="k"} 1"#),
        "{text}"
    );
}
