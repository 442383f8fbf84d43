//! The quota service (RLQS) on the real server's gRPC port, in process with a manual clock:
//! assignments on a stream, the counters it shares with `ShouldRateLimit`, bad reports, the
//! stream and bucket id bounds, health, metrics, `RLQS_ENABLED=false`, and shutdown ending
//! streams.

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Code;

use crate::common::rlqs::{self, strategy, Quota};
use crate::common::{desc, http_async, Server};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;

const RULES: &str = r"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
";

fn usage(tenant: &str, allowed: u64, elapsed_s: Option<i64>) -> rlqs::BucketQuotaUsage {
    rlqs::usage("tenant", tenant, allowed, elapsed_s)
}

fn report(usages: Vec<rlqs::BucketQuotaUsage>) -> rlqs::RateLimitQuotaUsageReports {
    rlqs::report("edge", usages)
}

async fn open(server: &Server) -> Result<Quota, tonic::Status> {
    rlqs::open(server.grpc).await
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
    let end = q.next().await;
    assert!(matches!(end, Ok(None)), "ended with OK: {end:?}");
    stopped.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_hundred_thousand_buckets_on_one_stream_stay_within_the_bound() {
    let server = Server::start(RULES, |s| {
        s.rlqs.as_mut().unwrap().max_buckets_per_stream = 1000;
    })
    .await;
    let mut q = open(&server).await.unwrap();
    let report_of = |chunk: usize| {
        report(
            (0..50_000)
                .map(|i| usage(&format!("t{chunk}-{i}"), 1, Some(0)))
                .collect(),
        )
    };
    let first = q.ask(report_of(0)).await.unwrap().unwrap();
    assert_eq!(
        first.bucket_action.len(),
        1000,
        "the first 1,000 buckets get assignments"
    );
    // The next 50,000 get none: no answer to wait for, the metrics say when it was taken.
    q.tx.send(report_of(1)).await.unwrap();
    let refused = "sluice_rlqs_refused_total{what=\"bucket\"} 99000";
    crate::common::wait_until_async(30, refused, || async {
        let (_, _, metrics) = http_async(server.http, "GET", "/metrics", "")
            .await
            .unwrap();
        metrics.contains(refused) && metrics.contains("sluice_rlqs_buckets 1000")
    })
    .await;
    // The stream goes on, and others are served.
    assert!(open(&server)
        .await
        .unwrap()
        .ask(report(vec![usage("acme", 1, Some(0))]))
        .await
        .unwrap()
        .is_some());
    drop(q);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_reports_end_the_stream_naming_the_problem() {
    let server = Server::start(RULES, |_| {}).await;
    let many = (0..65_537)
        .map(|i| usage(&format!("t{i}"), 1, Some(0)))
        .collect();
    let e = open(&server)
        .await
        .unwrap()
        .ask(report(many))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("65537 bucket usages"),
        "{}",
        e.message()
    );
    let mut wide = usage("acme", 1, Some(0));
    let id = wide.bucket_id.as_mut().unwrap();
    id.bucket
        .extend((0..5000).map(|i| (format!("k{i}"), "v".to_string())));
    let e = open(&server)
        .await
        .unwrap()
        .ask(report(vec![wide]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("5001 entries"), "{}", e.message());
    // Counts near 2^64 saturate: the bucket is denied, nothing wraps.
    let mut huge = usage("acme", u64::MAX, Some(5));
    huge.num_requests_denied = u64::MAX;
    let answer = open(&server)
        .await
        .unwrap()
        .ask(report(vec![huge]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        strategy(&answer),
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    );
    server.stop().await.unwrap();
}

/// The server's metrics page.
async fn metrics(server: &Server) -> String {
    http_async(server.http, "GET", "/metrics", "")
        .await
        .unwrap()
        .2
}

#[tokio::test]
async fn bucket_ids_are_bounded_in_bytes_each_and_all_together() {
    let server = Server::start(RULES, |s| {
        let r = s.rlqs.as_mut().unwrap();
        r.max_bucket_id_bytes = 64;
        r.max_tracked_id_bytes = 100;
    })
    .await;
    // "tenant" and 59 bytes: one past the id bound, which ends the stream naming it.
    let e = open(&server)
        .await
        .unwrap()
        .ask(report(vec![usage(&"x".repeat(59), 1, Some(0))]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message()
            .ends_with("65 bytes, more than RLQS_MAX_BUCKET_ID_BYTES (64)"),
        "{}",
        e.message()
    );
    // Ids of 50 bytes: two fill the 100 tracked, every stream together; a third gets no
    // assignment, on this stream or another.
    let tenant = |i: usize| format!("{i}{}", "y".repeat(43));
    let mut first = open(&server).await.unwrap();
    let three = (0..3).map(|i| usage(&tenant(i), 1, Some(0))).collect();
    let answer = first.ask(report(three)).await.unwrap().unwrap();
    let ids: Vec<_> = answer
        .bucket_action
        .iter()
        .map(|a| a.bucket_id.as_ref().unwrap().bucket["tenant"].clone())
        .collect();
    assert_eq!(ids, [tenant(0), tenant(1)]);
    let mut second = open(&server).await.unwrap();
    second
        .tx
        .send(report(vec![usage(&tenant(3), 1, Some(0))]))
        .await
        .unwrap();
    let refused = "sluice_rlqs_refused_total{what=\"bucket\"} 2";
    crate::common::wait_until_async(10, refused, || async {
        metrics(&server).await.contains(refused)
    })
    .await;
    // The first stream's end frees its ids' bytes: the second's bucket is tracked at its
    // next report.
    drop(first);
    crate::common::wait_until_async(10, "the closed stream's buckets freed", || async {
        metrics(&server).await.contains("sluice_rlqs_buckets 0")
    })
    .await;
    let answer = second
        .ask(report(vec![usage(&tenant(3), 1, Some(5))]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.bucket_action.len(), 1);
    assert!(metrics(&server).await.contains("sluice_rlqs_buckets 1"));
    drop(second);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn thousands_of_streams_stop_at_the_bound() {
    let server = Server::start(RULES, |s| {
        s.rlqs.as_mut().unwrap().max_streams = 1000;
        // All on one connection, so the test needs no more file descriptors than any other.
        s.grpc_limits.max_concurrent_streams = 2000;
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = RateLimitQuotaServiceClient::new(channel);
    let mut open_streams = Vec::new();
    let mut refused = 0;
    for _ in 0..1200 {
        match rlqs::open_with(client.clone()).await {
            Ok(q) => open_streams.push(q),
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                refused += 1;
            }
        }
    }
    assert_eq!((open_streams.len(), refused), (1000, 200));
    let (_, _, metrics) = http_async(server.http, "GET", "/metrics", "")
        .await
        .unwrap();
    assert!(metrics.contains("sluice_rlqs_streams 1000"), "{metrics}");
    // RLS is unaffected.
    let answer = server
        .client()
        .await
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![desc(&[("tenant", "solo")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 1);
    drop(open_streams);
    server.stop().await.unwrap();
}
