//! The gRPC face of the quota service: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`
//! over tonic. Each `StreamRateLimitQuotas` call is one task that takes the Envoy's usage
//! reports and refreshes its assignments every second (`rlqs::Stream`), sending the bucket
//! actions either produces. A bad report ends the stream with `INVALID_ARGUMENT` naming the
//! problem; the stream bound refuses with `RESOURCE_EXHAUSTED`. Shutdown stops the streams'
//! counting when the limiter closes (their reports wait unread), and ends every stream with
//! `OK` once the final flush has put this replica's counts in the store: the replica Envoy
//! reconnects to continues from the fleet's count.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::rlqs::{Quotas, Stream, StreamError, REFRESH};

/// Responses a stream may have waiting for Envoy to read them: a stream whose Envoy stops
/// reading stops being refreshed instead of queueing without bound.
const OUTBOX: usize = 4;

/// The quota service.
#[derive(Clone)]
pub struct QuotaService {
    quotas: Arc<Quotas>,
    stops: Stops,
}

/// Shutdown's two steps for the streams.
#[derive(Clone, Default)]
pub struct Stops {
    /// Stop counting: no report is taken and no assignment sent after this.
    pub closing: CancellationToken,
    /// End the streams (after the final flush).
    pub end: CancellationToken,
}

impl QuotaService {
    /// A service over `quotas`, stopped by `stops`.
    pub fn new(quotas: Arc<Quotas>, stops: Stops) -> Self {
        QuotaService { quotas, stops }
    }

    /// The tonic server wrapping this service.
    pub fn into_server(self) -> RateLimitQuotaServiceServer<QuotaService> {
        RateLimitQuotaServiceServer::new(self)
    }
}

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[async_trait::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let stream = Stream::open(&self.quotas).map_err(|e| status_of(&self.quotas, &e))?;
        let (tx, rx) = mpsc::channel(OUTBOX);
        let run = run(
            self.quotas.clone(),
            stream,
            request.into_inner(),
            tx,
            self.stops.clone(),
        );
        tokio::spawn(run);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A stream's task: reports in, actions out, a refresh every [`REFRESH`], until Envoy ends
/// it, a report is refused, or the service stops; then, when stopping, the stream stays open
/// until `stops.end`.
async fn run(
    quotas: Arc<Quotas>,
    mut stream: Stream,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    stops: Stops,
) {
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let actions = tokio::select! {
            _ = stops.closing.cancelled() => break,
            _ = tx.closed() => return,
            msg = reports.message() => match msg {
                Ok(Some(msg)) => {
                    let now = quotas.limiter().now();
                    match stream.report(&msg, now) {
                        Ok(actions) => actions,
                        Err(e) => {
                            let _ = tx.send(Err(status_of(&quotas, &e))).await;
                            return;
                        }
                    }
                }
                // Envoy ended its side, or the connection went.
                Ok(None) | Err(_) => return,
            },
            _ = refresh.tick() => stream.refresh(quotas.limiter().now()),
        };
        let refused = stream.take_refused();
        if refused > 0 {
            tracing::warn!(
                refused,
                buckets = stream.bucket_count(),
                "quota stream: buckets past RLQS_MAX_BUCKETS_PER_STREAM or RLQS_MAX_BUCKETS get no assignment"
            );
        }
        if !send(&tx, actions).await {
            return;
        }
    }
    // Shutting down: Envoy keeps its assignments until the stream ends, after the flush.
    tokio::select! {
        _ = stops.end.cancelled() => {}
        _ = tx.closed() => {}
    }
}

/// Sends `actions` if there are any; false once the stream is gone.
async fn send(
    tx: &mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    actions: Vec<BucketAction>,
) -> bool {
    if actions.is_empty() {
        return true;
    }
    let response = RateLimitQuotaResponse {
        bucket_action: actions,
    };
    tx.send(Ok(response)).await.is_ok()
}

/// A stream error as the status Envoy gets; a refused report counted (a refused stream is,
/// by `Stream::open`).
fn status_of(quotas: &Quotas, e: &StreamError) -> Status {
    match e {
        StreamError::Report(_) => {
            let errors = &quotas.stats.stream_errors;
            errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Status::invalid_argument(e.to_string())
        }
        StreamError::TooManyStreams(_) => Status::resource_exhausted(e.to_string()),
    }
}
