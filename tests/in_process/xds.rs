//! Rules over xDS: a real management server (tests/common/xds.rs) pushes RateLimitConfig sets
//! to an in-process sluice, and every step of the state-of-the-world protocol is checked from
//! the server's side: the subscription (node id, metadata, headers), ACKs with version and
//! nonce, NACKs that carry the errors and the last accepted version, readiness before the
//! first set, and a reconnect after the server restarts.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common;
use crate::common::xds::{config, AdsServer, TYPE_URL};
use crate::common::{desc, http_async, wait_for_body, wait_until_async, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit::{Minute, Unknown};
use sluice::sources::xds::{XdsSettings, XdsTls};

pub(crate) fn xds_settings(ads: SocketAddr) -> XdsSettings {
    XdsSettings {
        server_url: ads.to_string(),
        node_id: "test-node".into(),
        node_metadata: vec![("zone".into(), "a".into())],
        headers: vec![("authorization".into(), "Bearer t".into())],
        // Short, so the restart test reconnects quickly; the doubling is capped at 200 ms.
        retry_interval: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        max_message_bytes: None,
        tls: None,
        force_start: false,
        need_a_domain: false,
    }
}

async fn start(ads: &AdsServer) -> Server {
    let addr = ads.addr;
    Server::start("", |s| s.xds = Some(xds_settings(addr))).await
}

/// One hit on `key` in domain `x`: (overall code, limit, remaining).
async fn hit(s: &Server, key: &str) -> (i32, u32, u32) {
    let r = s
        .client()
        .await
        .should_rate_limit(RateLimitRequest {
            domain: "x".into(),
            descriptors: vec![desc(&[(key, "v")])],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let st = &r.statuses[0];
    let limit = st.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
    (r.overall_code, limit, st.limit_remaining)
}

const OK: i32 = 1;
const OVER: i32 = 2;

#[tokio::test]
async fn rules_pushed_over_xds_take_effect_are_acked_and_replaced() {
    let ads = AdsServer::start(None).await;
    ads.set("v1", &[config("x", &[("k", Minute, 2)])]);
    let s = start(&ads).await;

    // The subscription: every RateLimitConfig, no version yet, as the node configured.
    let first = ads.requests()[0].clone();
    assert_eq!(first.type_url, TYPE_URL);
    assert!(first.resource_names.is_empty() && first.version_info.is_empty());
    let node = first.node.expect("the node");
    assert_eq!(node.id, "test-node");
    assert_eq!(node.user_agent_name, "sluice");
    let zone = &node.metadata.expect("node metadata").fields["zone"];
    assert_eq!(
        format!("{:?}", zone.kind),
        r#"Some(StringValue("a"))"#,
        "metadata values are strings, as the reference sends them"
    );
    assert_eq!(
        ads.headers()[0].get("authorization").unwrap(),
        "Bearer t",
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS go with the stream"
    );

    // The ACK carries the version and the nonce of the response.
    let nonce = ads.nonce_of("v1").unwrap();
    let ack = ads
        .wait_request("the ACK of v1", |r| r.response_nonce == nonce)
        .await;
    assert_eq!(ack.version_info, "v1");
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);

    // The rules are in force.
    assert_eq!(hit(&s, "k").await, (OK, 2, 1));
    assert_eq!(hit(&s, "k").await, (OK, 2, 0));
    assert_eq!(hit(&s, "k").await.0, OVER);
    wait_for_body(s.http, "/rlconfig", "x.k: unit=MINUTE requests_per_unit=2").await;

    // A new version replaces them whole.
    ads.set("v2", &[config("x", &[("k", Minute, 5), ("j", Minute, 1)])]);
    let nonce = loop_nonce(&ads, "v2").await;
    let ack = ads
        .wait_request("the ACK of v2", |r| r.response_nonce == nonce)
        .await;
    assert_eq!(ack.version_info, "v2");
    assert!(ack.error_detail.is_none());
    assert_eq!(hit(&s, "k").await.1, 5);
    assert_eq!(hit(&s, "j").await, (OK, 1, 0));
    assert_eq!(hit(&s, "j").await.0, OVER);
    let (_, _, metrics) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        metrics.contains(r#"sluice_config_load_total{result="success"} 2"#),
        "xDS loads are counted: {metrics}"
    );
    s.stop().await.unwrap();
}

/// The nonce of the response that carried `version`, once it has been sent.
async fn loop_nonce(ads: &AdsServer, version: &str) -> String {
    let mut nonce = None;
    wait_until_async(30, &format!("{version} to be sent"), || {
        nonce = ads.nonce_of(version);
        std::future::ready(nonce.is_some())
    })
    .await;
    nonce.unwrap()
}

#[tokio::test]
async fn a_bad_set_is_nacked_with_its_errors_and_the_rules_in_force_stay() {
    let ads = AdsServer::start(None).await;
    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    let s = start(&ads).await;
    assert_eq!(hit(&s, "k").await, (OK, 1, 0));

    // No unit, and the same domain twice (MERGE_DOMAIN_CONFIG is off).
    ads.set(
        "v2",
        &[
            config("x", &[("k", Unknown, 9)]),
            config("x", &[("j", Minute, 1)]),
        ],
    );
    let nonce = loop_nonce(&ads, "v2").await;
    let nack = ads
        .wait_request("the NACK of v2", |r| r.response_nonce == nonce)
        .await;
    assert_eq!(nack.version_info, "v1", "a NACK names the version in force");
    let detail = nack.error_detail.expect("the errors");
    assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
    assert!(
        detail
            .message
            .contains("xds:x: invalid rate limit unit 'unknown'")
            && detail
                .message
                .contains("xds:x: duplicate domain 'x' in config file"),
        "{}",
        detail.message
    );

    // v1 is still in force: k is still over its limit of 1, and j has no rule.
    assert_eq!(hit(&s, "k").await, (OVER, 1, 0));
    assert_eq!(hit(&s, "j").await, (OK, 0, 0));
    let (_, _, metrics) = http_async(s.http, "GET", "/metrics", "").await.unwrap();
    assert!(
        metrics.contains(r#"sluice_config_load_total{result="error"} 1"#),
        "{metrics}"
    );
    wait_for_body(s.http, "/readyz", "last reload rejected").await;

    // A good set after a bad one is accepted.
    ads.set("v3", &[config("x", &[("k", Minute, 3)])]);
    let nonce = loop_nonce(&ads, "v3").await;
    let ack = ads
        .wait_request("the ACK of v3", |r| r.response_nonce == nonce)
        .await;
    assert_eq!(ack.version_info, "v3");
    assert!(ack.error_detail.is_none());
    assert_eq!(hit(&s, "k").await.1, 3);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn not_ready_and_unlimited_until_the_first_set_arrives() {
    let ads = AdsServer::start(None).await;
    let addr = ads.addr;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_unready(dir, |s| s.xds = Some(xds_settings(addr))).await;
    // Subscribed, but nothing served yet.
    ads.wait_request("the subscription", |_| true).await;
    let (code, _, body) = http_async(s.http, "GET", "/readyz", "").await.unwrap();
    assert_eq!(code, 503, "{body}");
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Channel::from_shared(format!("http://{}", s.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let status = |service: &str| tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(
        health
            .check(status("ratelimit"))
            .await
            .unwrap()
            .into_inner()
            .status,
        not_serving
    );
    // No rules: every request is allowed meanwhile.
    assert_eq!(hit(&s, "k").await.0, OK);

    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    s.wait_ready().await;
    assert_eq!(
        health
            .check(status("ratelimit"))
            .await
            .unwrap()
            .into_inner()
            .status,
        serving
    );
    assert_eq!(
        health.check(status("")).await.unwrap().into_inner().status,
        serving
    );
    assert_eq!(hit(&s, "k").await, (OK, 1, 0));
    assert_eq!(hit(&s, "k").await.0, OVER);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn force_start_is_ready_at_once_and_an_empty_set_can_be_unhealthy() {
    let ads = AdsServer::start(None).await;
    let addr = ads.addr;
    let s = Server::start("", |s| {
        s.xds = Some(XdsSettings {
            force_start: true,
            need_a_domain: true,
            ..xds_settings(addr)
        })
    })
    .await; // ready without a set
    ads.set("v1", &[]);
    let nonce = loop_nonce(&ads, "v1").await;
    ads.wait_request("the ACK of the empty set", |r| r.response_nonce == nonce)
        .await;
    // An empty set is accepted, but with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED it is not
    // enough to be ready.
    wait_until_async(30, "not ready on an empty set", || async {
        matches!(
            http_async(s.http, "GET", "/readyz", "").await,
            Ok((503, _, _))
        )
    })
    .await;
    ads.set("v2", &[config("x", &[("k", Minute, 1)])]);
    s.wait_ready().await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn the_client_reconnects_when_the_server_restarts() {
    let ads = AdsServer::start(None).await;
    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    let s = start(&ads).await;
    assert_eq!(hit(&s, "k").await, (OK, 1, 0));

    // The server goes away; the rules in force stay while sluice retries.
    let addr = ads.kill().await;
    assert_eq!(hit(&s, "k").await.0, OVER);

    let ads = AdsServer::start_on(addr, None).await;
    ads.set("v2", &[config("x", &[("k", Minute, 4)])]);
    let again = ads
        .wait_request("the new subscription", |r| r.response_nonce.is_empty())
        .await;
    assert_eq!(
        again.version_info, "v1",
        "a new stream names the version in force"
    );
    assert_eq!(again.node.unwrap().id, "test-node");
    let nonce = loop_nonce(&ads, "v2").await;
    let ack = ads
        .wait_request("the ACK of v2", |r| r.response_nonce == nonce)
        .await;
    assert_eq!(ack.version_info, "v2");
    assert_eq!(hit(&s, "k").await.1, 4);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn rules_come_over_mtls_verified_under_the_configured_name() {
    common::require_tool("openssl", "apt-get install openssl");
    let dir = tempfile::tempdir().unwrap();
    let ca = common::certs::ca(dir.path(), "ca");
    // The server's certificate names neither 127.0.0.1 nor localhost: only the SAN setting
    // makes it acceptable.
    let server = common::certs::leaf(dir.path(), "xds", &ca, "serverAuth", "DNS:xds.internal");
    let client = common::certs::leaf(dir.path(), "client", &ca, "clientAuth", "DNS:sluice");
    let ads = AdsServer::start_tls(
        sluice::server::tls::GrpcTls {
            cert: server.cert,
            key: server.key,
            client_ca: Some(ca.cert.clone()),
            client_san: None,
        },
        None,
    )
    .await;
    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    let addr = ads.addr;
    let s = Server::start("", |s| {
        s.xds = Some(XdsSettings {
            tls: Some(XdsTls {
                client_cert: Some(client.cert),
                client_key: Some(client.key),
                server_ca: Some(ca.cert),
                server_san: Some("xds.internal".into()),
            }),
            ..xds_settings(addr)
        })
    })
    .await;
    let nonce = loop_nonce(&ads, "v1").await;
    ads.wait_request("the ACK of v1", |r| r.response_nonce == nonce)
        .await;
    assert_eq!(hit(&s, "k").await, (OK, 1, 0));
    assert_eq!(hit(&s, "k").await.0, OVER);
    s.stop().await.unwrap();
}

/// A child process killed when dropped, so a failing test leaves none behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real binary, configured by the reference's variables alone (no rules path at all).
#[tokio::test]
async fn the_binary_takes_its_rules_from_the_reference_variables() {
    let ads = AdsServer::start(None).await;
    ads.set("v1", &[config("x", &[("k", Minute, 1)])]);
    let http_port = common::free_port();
    let http: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .env_clear()
        .arg("serve")
        .envs([
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &ads.addr.to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", "proc-node"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=b"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", &common::free_port().to_string()),
            ("HOST", "127.0.0.1"),
            ("PORT", &http_port.to_string()),
        ])
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    // Killed however the test ends.
    let _proc = KillOnDrop(child);
    wait_until_async(30, "the process to become ready", || async {
        matches!(
            http_async(http, "GET", "/readyz", "").await,
            Ok((200, _, _))
        )
    })
    .await;
    let node = ads.requests()[0].node.clone().unwrap();
    assert_eq!(node.id, "proc-node");
    assert!(node.metadata.unwrap().fields.contains_key("zone"));
    let body = r#"{"domain":"x","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    assert_eq!(
        http_async(http, "POST", "/json", body).await.unwrap().0,
        200
    );
    assert_eq!(
        http_async(http, "POST", "/json", body).await.unwrap().0,
        429
    );
}
