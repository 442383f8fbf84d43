//! The quota service (RLQS) on the real server's gRPC port, in process with a manual clock:
//! assignments on a stream, the counters it shares with `ShouldRateLimit`, bad reports,
//! the stream bound, health, metrics, `RLQS_ENABLED=false`, and shutdown ending streams.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

use crate::common::{desc, http_async, Server};

const RULES: &str = r"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
";

fn usage(tenant: &str, allowed: u64, elapsed_s: Option<i64>) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: HashMap::from([("tenant".to_string(), tenant.to_string())]),
        }),
        time_elapsed: elapsed_s.map(|seconds| PbDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: usages,
    }
}

/// An open stream: reports go in through `tx`, responses come out of `rx`.
struct Quota {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

async fn open(server: &Server) -> Result<Quota, tonic::Status> {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let (tx, reports) = mpsc::channel(4);
    let rx = client
        .stream_rate_limit_quotas(ReceiverStream::new(reports))
        .await?
        .into_inner();
    Ok(Quota { tx, rx })
}

impl Quota {
    /// Sends `msg` and returns the next response (or the stream's end as a status).
    async fn ask(
        &mut self,
        msg: RateLimitQuotaUsageReports,
    ) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        self.tx.send(msg).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("an answer within 10 s")
    }
}

fn strategy(r: &RateLimitQuotaResponse) -> Strategy {
    match r.bucket_action[0].bucket_action.as_ref().unwrap() {
        Action::QuotaAssignmentAction(a) => a.rate_limit_strategy.unwrap().strategy.unwrap(),
        Action::AbandonAction(_) => panic!("an abandon"),
    }
}

#[tokio::test]
async fn a_stream_gets_assignments_that_share_the_rls_counter() {
    let server = Server::start(RULES, |_| {}).await;
    let mut q = open(&server).await.unwrap();
    let first = q
        .ask(report(vec![usage("acme", 1, Some(0))]))
        .await
        .unwrap()
        .unwrap();
    match strategy(&first) {
        Strategy::TokenBucket(t) => assert_eq!(t.max_tokens, 9, "10 less the one admitted"),
        other => panic!("{other:?}"),
    }
    let full = q
        .ask(report(vec![usage("acme", 9, Some(5))]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        strategy(&full),
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    // ShouldRateLimit on the same tenant sees the count Envoy reported.
    let mut rls = server.client().await;
    let answer = rls
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![desc(&[("tenant", "acme")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 2, "OVER_LIMIT: the 11th of 10");
    let (_, _, metrics) = http_async(server.http, "GET", "/metrics", "")
        .await
        .unwrap();
    for line in [
        "sluice_rlqs_streams 1",
        "sluice_rlqs_reports_total 2",
        "sluice_rlqs_assignments_total{kind=\"deny_all\"} 1",
        "sluice_rlqs_assignments_total{kind=\"token_bucket\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_bad_report_ends_the_stream_with_invalid_argument() {
    let server = Server::start(RULES, |_| {}).await;
    let mut q = open(&server).await.unwrap();
    let e = q
        .ask(report(vec![usage("acme", 1, None)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "bucket usage 0: no time_elapsed");
    // Nothing else is affected: a new stream is served.
    let mut again = open(&server).await.unwrap();
    assert!(again
        .ask(report(vec![usage("acme", 1, Some(0))]))
        .await
        .unwrap()
        .is_some());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn streams_past_the_bound_are_refused() {
    let server = Server::start(RULES, |s| {
        s.rlqs.as_mut().unwrap().max_streams = 1;
    })
    .await;
    let mut first = open(&server).await.unwrap();
    let e = open(&server).await.err().expect("the second is refused");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("RLQS_MAX_STREAMS"), "{}", e.message());
    // The first is still served; once it ends, a new one is.
    assert!(first
        .ask(report(vec![usage("acme", 1, Some(0))]))
        .await
        .unwrap()
        .is_some());
    drop(first);
    crate::common::wait_until_async(10, "the closed stream to free its place", || async {
        open(&server).await.is_ok()
    })
    .await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn health_names_the_quota_service_only_when_it_is_served() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    const NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
    let check = |server: &Server| {
        let addr = format!("http://{}", server.grpc);
        async move {
            let channel = tonic::transport::Endpoint::from_shared(addr)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut health = HealthClient::new(channel);
            health
                .check(HealthCheckRequest {
                    service: NAME.into(),
                })
                .await
                .map(|r| r.into_inner().status)
        }
    };
    let on = Server::start(RULES, |_| {}).await;
    assert_eq!(check(&on).await.unwrap(), 1, "SERVING");
    on.stop().await.unwrap();
    let off = Server::start(RULES, |s| s.rlqs = None).await;
    assert_eq!(check(&off).await.unwrap_err().code(), Code::NotFound);
    let e = open(&off).await.err().expect("not served");
    assert_eq!(e.code(), Code::Unimplemented);
    off.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_open_streams_cleanly() {
    let server = Server::start(RULES, |_| {}).await;
    let mut q = open(&server).await.unwrap();
    assert!(q
        .ask(report(vec![usage("acme", 1, Some(0))]))
        .await
        .unwrap()
        .is_some());
    let stopped = tokio::spawn(server.stop());
    let end = tokio::time::timeout(Duration::from_secs(10), q.rx.message())
        .await
        .expect("the stream ends within 10 s");
    assert!(matches!(end, Ok(None)), "ended with OK: {end:?}");
    stopped.await.unwrap().unwrap();
}
