//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService` over tonic, the standard
//! `grpc.health.v1` service, and server reflection from the vendored descriptor set.
//!
//! Error mapping, chosen so Envoy's `failure_mode_deny` decides what a failure means: a
//! malformed request (empty domain, empty descriptor list, bounds exceeded) is
//! `INVALID_ARGUMENT` with the reason; an internal failure is `UNAVAILABLE`. A rate-limit
//! decision, over the limit included, is always a normal response.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::rls::RateLimiter;

/// The encoded `FileDescriptorSet` of the RLS protos, for reflection (see proto-vendor/).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("../../proto-vendor/rls_descriptor_set.bin");

/// The RLS service.
#[derive(Debug, Clone)]
pub struct RlsService {
    limiter: Arc<RateLimiter>,
}

impl RlsService {
    /// A service answering from `limiter`.
    pub fn new(limiter: Arc<RateLimiter>) -> Self {
        RlsService { limiter }
    }

    /// The tonic server wrapping this service.
    pub fn into_server(self) -> RateLimitServiceServer<RlsService> {
        RateLimitServiceServer::new(self)
    }
}

#[async_trait::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let start = tokio::time::Instant::now();
        let result = self
            .limiter
            .should_rate_limit_async(request.get_ref())
            .await;
        self.limiter
            .telemetry()
            .service
            .response_time
            .record(start.elapsed());
        result.map(Response::new).map_err(|e| {
            if e.is_client_error() {
                Status::invalid_argument(e.to_string())
            } else {
                Status::unavailable(e.to_string())
            }
        })
    }
}
