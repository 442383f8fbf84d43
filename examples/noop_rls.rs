//! A no-op RLS server on sluice's own stack (tonic + envoy-types, the same multi-threaded tokio
//! runtime): every `ShouldRateLimit` is answered OK at once. `benches/cpu.sh` measures sluice's
//! server CPU per request against this floor, so what is left is what sluice itself adds.
//!
//! Usage: `noop_rls [ADDR]` (default `127.0.0.1:8091`).

#![forbid(unsafe_code)]

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8091".into())
        .parse()?;
    // Built like sluice's runtime (src/main.rs), so both pay the same scheduling costs.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(Noop))
                .serve(addr)
                .await
        })?;
    Ok(())
}
