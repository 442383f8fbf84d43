//! The gRPC face of the quota service: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`
//! over tonic. Each `StreamRateLimitQuotas` call is one task that takes the Envoy's usage
//! reports and refreshes its assignments every second, and as an epoch ends when a share is
//! due then (`rlqs::Stream`), sending the bucket actions either produces. A bad report ends
//! the stream with `INVALID_ARGUMENT` naming the problem; the stream bound refuses with
//! `RESOURCE_EXHAUSTED`. Shutdown stops the streams' counting when the limiter closes (their
//! reports wait unread), and ends every stream with `OK` once the final flush has put this
//! replica's counts in the store: the replica Envoy reconnects to continues from the fleet's
//! count.
//!
//! The server is envoy-types' generated one but for its codec: a report reaches
//! `rlqs::Stream::report` as the message's bytes, read in place (`rlqs/report.rs` says why),
//! and a response leaves as the bytes the stream encoded (`rlqs/response.rs`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::SERVICE_NAME;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use crate::rlqs::{Actions, Quotas, Stream, StreamError, REFRESH};
use crate::server::grpc::BoxFuture;

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
    pub fn into_server(self) -> QuotaServer {
        QuotaServer(self)
    }

    /// Opens a `StreamRateLimitQuotas` stream: its task runs until the stream ends.
    fn open(&self, reports: Streaming<Bytes>) -> Result<Responses, Status> {
        let stream = Stream::open(&self.quotas).map_err(|e| status_of(&self.quotas, &e))?;
        let (tx, rx) = mpsc::channel(OUTBOX);
        let run = run(self.quotas.clone(), stream, reports, tx, self.stops.clone());
        tokio::spawn(run);
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// `RateLimitQuotaResponse` messages, as their bytes.
type Responses = Pin<Box<dyn tokio_stream::Stream<Item = Result<Bytes, Status>> + Send>>;

/// `RateLimitQuotaService` as a tonic service, routed by its name.
#[derive(Clone)]
pub struct QuotaServer(QuotaService);

impl NamedService for QuotaServer {
    const NAME: &'static str = SERVICE_NAME;
}

impl<B> tower::Service<http::Request<B>> for QuotaServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        const METHOD: &str =
            "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";
        if req.uri().path() != METHOD {
            return Box::pin(std::future::ready(
                Ok(Status::unimplemented("").into_http()),
            ));
        }
        let service = self.0.clone();
        Box::pin(async move { Ok(Grpc::new(ReportCodec).streaming(service, req).await) })
    }
}

impl StreamingService<Bytes> for QuotaService {
    type Response = Bytes;
    type ResponseStream = Responses;
    type Future = std::future::Ready<Result<Response<Responses>, Status>>;

    fn call(&mut self, request: Request<Streaming<Bytes>>) -> Self::Future {
        std::future::ready(self.open(request.into_inner()).map(Response::new))
    }
}

/// Reports in and responses out as their bytes.
#[derive(Clone, Copy, Default)]
struct ReportCodec;

impl Codec for ReportCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = ReportCodec;
    type Decoder = ReportCodec;

    fn encoder(&mut self) -> ReportCodec {
        ReportCodec
    }

    fn decoder(&mut self) -> ReportCodec {
        ReportCodec
    }
}

impl Encoder for ReportCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // EncodeBuf grows as needed.
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for ReportCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// A stream's task: reports in, actions out, a refresh every [`REFRESH`], until Envoy ends
/// it, a report is refused, or the service stops; then, when stopping, the stream stays open
/// until `stops.end`.
async fn run(
    quotas: Arc<Quotas>,
    mut stream: Stream,
    mut reports: Streaming<Bytes>,
    tx: mpsc::Sender<Result<Bytes, Status>>,
    stops: Stops,
) {
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wake = stream.wake_at().map(|at| {
            let now = quotas.limiter().now();
            Duration::from_millis(at.0.saturating_sub(now.0))
        });
        let actions = tokio::select! {
            _ = stops.closing.cancelled() => break,
            _ = tx.closed() => return,
            msg = reports.message() => match msg {
                Ok(Some(msg)) => {
                    let now = quotas.limiter().now();
                    match stream.report(&msg[..], now) {
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
            // A share to look at again as an epoch ends (`Stream::wake_at`), before the tick.
            () = woken(wake) => stream.refresh(quotas.limiter().now()),
        };
        let refused = stream.take_refused();
        if refused.total() > 0 {
            tracing::warn!(
                refused = refused.total(),
                by = %refused,
                buckets = stream.bucket_count(),
                "quota stream: new buckets past a bound get no assignment"
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

/// Sleeps for `after`, or for ever without it.
async fn woken(after: Option<Duration>) {
    match after {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Sends `actions` if there are any; false once the stream is gone.
async fn send(tx: &mpsc::Sender<Result<Bytes, Status>>, actions: Actions) -> bool {
    if actions.is_empty() {
        return true;
    }
    tx.send(Ok(actions.into_bytes())).await.is_ok()
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
