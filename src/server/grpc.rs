//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService` over tonic, the standard
//! `grpc.health.v1` service, and server reflection from the vendored descriptor set.
//!
//! Error mapping, chosen so Envoy's `failure_mode_deny` decides what a failure means: a
//! malformed request (empty domain, empty descriptor list, bounds exceeded) is
//! `INVALID_ARGUMENT` with the reason; an internal failure is `UNAVAILABLE`. A rate-limit
//! decision, over the limit included, is always a normal response.
//!
//! With `TRACING_ENABLED`, each call is a span continuing the caller's trace (see
//! `telemetry/otel.rs`); without it the call path is the same as if tracing did not exist.
//!
//! The server is envoy-types' generated one but for its codec (`rls_codec.rs`: the request
//! read and the response written by hand) and its method's future: an answer that needs no
//! store call is ready when the method is called, not a boxed `async` block. Compression,
//! message sizes and every status are tonic's (`Grpc::unary`). The port (`grpc_serve.rs`)
//! hands `ShouldRateLimit` to `rls_unary::call` itself; [`RlsServer`] answers the service's
//! other paths among tonic's routes.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::future::Either;
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::rls::{RateLimiter, RequestError};
use crate::server::rls_unary;
use crate::telemetry::otel::{Tracer, Via};

/// The encoded `FileDescriptorSet` of the RLS and RLQS protos, for reflection (see
/// proto-vendor/).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("../../proto-vendor/descriptor_set.bin");

/// The fully-qualified name of the rate limit quota service (RLQS), which
/// `FILE_DESCRIPTOR_SET` describes.
pub const RLQS_SERVICE: &str =
    envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::SERVICE_NAME;

/// The fully-qualified name of the rate-limit service (RLS).
pub const RLS_SERVICE: &str =
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;

/// A reflection builder over `FILE_DESCRIPTOR_SET` that lists exactly `served` (plus the
/// reflection service itself, which the caller names per version). Listing by name rather
/// than everything the set describes keeps `list` truthful: the set describes RLQS whether or
/// not it is registered, and a client should not discover a service that answers
/// `UNIMPLEMENTED`. Every symbol of the set is still resolvable (`file_containing_symbol`).
pub fn reflection<'a>(served: &[&str]) -> tonic_reflection::server::Builder<'a> {
    served.iter().fold(
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET),
        |b, name| b.with_service_name(*name),
    )
}

/// The RLS service.
#[derive(Debug, Clone)]
pub struct RlsService {
    limiter: Arc<RateLimiter>,
    tracer: Option<Arc<Tracer>>,
}

impl RlsService {
    /// A service answering from `limiter`, untraced.
    pub fn new(limiter: Arc<RateLimiter>) -> Self {
        RlsService {
            limiter,
            tracer: None,
        }
    }

    /// Traces each call with `tracer` (`TRACING_ENABLED`).
    pub fn with_tracer(mut self, tracer: Option<Arc<Tracer>>) -> Self {
        self.tracer = tracer;
        self
    }

    /// The limiter's answer, timed for the response-time histogram.
    pub(crate) async fn answer(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let start = tokio::time::Instant::now();
        let result = self.limiter.should_rate_limit_async(request).await;
        self.timed(start);
        result.map_err(status_of)
    }

    fn timed(&self, start: tokio::time::Instant) {
        let service = &self.limiter.telemetry().service;
        service.response_time.record(start.elapsed());
    }

    /// The tonic server wrapping this service.
    pub fn into_server(self) -> RlsServer {
        RlsServer(self)
    }

    /// A call that awaits: traced, or with exact descriptors for the store.
    async fn awaited(
        self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Some(tracer) = &self.tracer else {
            return self.answer(request.get_ref()).await.map(Response::new);
        };
        let req = request.get_ref();
        let meta = request.metadata();
        let span = tracer.start(
            Via::Grpc,
            |name| meta.get(name).and_then(|v| v.to_str().ok()),
            &req.domain,
            req.descriptors.len(),
        );
        let result = self.answer(req).await;
        if let Some(span) = span {
            match &result {
                Ok(r) => span.end(0, Ok(overall_code(r))),
                Err(s) => span.end(s.code() as i64, Err(s.message())),
            }
        }
        result.map(Response::new)
    }
}

/// A request the limiter refused, as its status.
fn status_of(e: RequestError) -> Status {
    if e.is_client_error() {
        Status::invalid_argument(e.to_string())
    } else {
        Status::unavailable(e.to_string())
    }
}

/// A boxed answer, sent between tasks.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type Answered = Result<Response<RateLimitResponse>, Status>;

impl UnaryService<RateLimitRequest> for RlsService {
    type Response = RateLimitResponse;
    type Future = Either<Ready<Answered>, BoxFuture<Answered>>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        if self.tracer.is_none() {
            let start = tokio::time::Instant::now();
            if let Some(result) = self.limiter.should_rate_limit_now(request.get_ref()) {
                self.timed(start);
                return Either::Left(ready(result.map(Response::new).map_err(status_of)));
            }
        }
        Either::Right(Box::pin(self.clone().awaited(request)))
    }
}

impl rls_unary::Rls for RlsService {
    fn traced(&self) -> bool {
        self.tracer.is_some()
    }

    fn answer(
        &self,
        req: &RateLimitRequest,
    ) -> impl Future<Output = Result<RateLimitResponse, Status>> + Send {
        RlsService::answer(self, req)
    }
}

/// The path of the RLS service's one method.
pub(crate) const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `RateLimitService` as a tonic service, routed by its name.
#[derive(Debug, Clone)]
pub struct RlsServer(RlsService);

impl NamedService for RlsServer {
    const NAME: &'static str = RLS_SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for RlsServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != METHOD {
            return Box::pin(ready(Ok(unimplemented())));
        }
        let service = self.0.clone();
        Box::pin(async move { Ok(rls_unary::call(service, req).await) })
    }
}

/// Another method of the service: `UNIMPLEMENTED`, with the headers the generated server
/// sends.
fn unimplemented() -> http::Response<tonic::body::Body> {
    let mut response = http::Response::new(tonic::body::Body::default());
    let headers = response.headers_mut();
    headers.insert(
        Status::GRPC_STATUS,
        (tonic::Code::Unimplemented as i32).into(),
    );
    headers.insert(
        http::header::CONTENT_TYPE,
        tonic::metadata::GRPC_CONTENT_TYPE,
    );
    response
}

/// The overall code's name, as a span carries it.
pub(crate) fn overall_code(r: &RateLimitResponse) -> &'static str {
    Code::try_from(r.overall_code).map_or("UNKNOWN", |c| c.as_str_name())
}
