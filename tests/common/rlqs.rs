//! A quota service (RLQS) client for tests: a stream to a server's gRPC port, and the usage
//! reports Envoy sends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// One bucket's usage: `{key: value}`, `allowed` requests over `elapsed_s` (`None`: the field
/// left out, which the service refuses).
pub fn usage(key: &str, value: &str, allowed: u64, elapsed_s: Option<i64>) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: HashMap::from([(key.to_string(), value.to_string())]),
        }),
        time_elapsed: elapsed_s.map(|seconds| PbDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

/// A report of `usages` in `domain`.
pub fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: usages,
    }
}

/// An open stream: reports go in through `tx`, responses come out of `rx`.
pub struct Quota {
    pub tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub rx: Streaming<RateLimitQuotaResponse>,
}

/// Opens a stream to the quota service on `grpc`, on a connection of its own.
pub async fn open(grpc: SocketAddr) -> Result<Quota, tonic::Status> {
    let client = RateLimitQuotaServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    open_with(client).await
}

/// Opens a stream through `client` (streams of one channel share its connection).
pub async fn open_with(
    mut client: RateLimitQuotaServiceClient<tonic::transport::Channel>,
) -> Result<Quota, tonic::Status> {
    let (tx, reports) = mpsc::channel(4);
    let rx = client
        .stream_rate_limit_quotas(ReceiverStream::new(reports))
        .await?
        .into_inner();
    Ok(Quota { tx, rx })
}

impl Quota {
    /// Sends `msg` and returns the next response (or the stream's end as a status).
    pub async fn ask(
        &mut self,
        msg: RateLimitQuotaUsageReports,
    ) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        self.tx.send(msg).await.unwrap();
        self.next().await
    }

    /// The next response, or the stream's end (within 10 s).
    pub async fn next(&mut self) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("an answer within 10 s")
    }
}

/// The strategy of a response's first action.
#[allow(dead_code)] // in_process only
pub fn strategy(r: &RateLimitQuotaResponse) -> Strategy {
    match r.bucket_action[0].bucket_action.as_ref().unwrap() {
        Action::QuotaAssignmentAction(a) => a.rate_limit_strategy.unwrap().strategy.unwrap(),
        Action::AbandonAction(_) => panic!("an abandon"),
    }
}
