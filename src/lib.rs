//! sluice: an external rate-limit service for Envoy and Istio — envoyproxy/ratelimit's rules
//! and wire semantics, decided from memory.
//!
//! # Layout
//! Dependencies point one way: the pure core (`clock`, `limiter`, `config`, `rules`) imports
//! nothing from the I/O edges.
//! - `clock`: the `Clock` trait; the only place that reads the wall clock.
//! - `limiter`: the decision core, `decide(state, limit, now, hits)`.
//! - `config`: the rules YAML model and key checks; `rules`: validation, compilation, matching.
//! - `state`: the bounded entity table (moka) of counters.
//! - `service`: RLS v3 semantics over the rules and the table, transport-independent.
//! - `grpc`: the tonic service, health and reflection; `admin`: the HTTP endpoints.
//! - `reload`: loading rules from disk and hot reload; `telemetry`: metrics and logs.
//! - `sync`: global mode's background sync (queues, shard tasks); `redis`: its Redis stores;
//!   `global`: starting them.
//! - `settings`: flags and environment; `shutdown`: signals and readiness; `client`: `query`
//!   and `load`.
//!
//! [`run`] wires them: load rules, serve gRPC and HTTP, watch the rules, and on the shutdown
//! future go not-ready, drain gRPC within the grace period, then stop.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod cli;
pub mod core;
pub mod global;
pub mod rls;
pub mod rules;
pub mod server;
pub mod settings;
pub mod sim;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::rls::RateLimiter;
use crate::rules::model::ConfigError;
use crate::server::grpc::{self, RlsService};
use crate::server::reload::ReloadStatus;
use crate::server::shutdown::Readiness;
use crate::server::{http, reload};
use crate::settings::Settings;
use crate::telemetry::Telemetry;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The rules at start were rejected.
    #[error("rules rejected:\n{}", .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Rules(Vec<ConfigError>),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The metrics pipeline could not be built.
    #[error("metrics: {0}")]
    Telemetry(#[from] opentelemetry_sdk::error::OTelSdkError),
    /// The rules directory cannot be watched.
    #[error("cannot watch the rules: {0}")]
    Watch(#[from] notify::Error),
    /// Reflection could not be set up from the descriptor set.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    /// A server task ended without an error of its own (it panicked or was cancelled).
    #[error("{0} server stopped unexpectedly")]
    Stopped(&'static str),
    /// The Redis settings are unusable.
    #[error("redis: {0}")]
    Redis(String),
}

/// The bound gRPC and HTTP listeners. Binding before [`run`] lets tests use port 0.
#[derive(Debug)]
pub struct Listeners {
    /// gRPC.
    pub grpc: TcpListener,
    /// HTTP.
    pub http: TcpListener,
}

impl Listeners {
    /// Binds the addresses in `settings`.
    ///
    /// # Errors
    /// [`RunError::Bind`] naming the address.
    pub async fn bind(settings: &Settings) -> Result<Listeners, RunError> {
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::Bind { addr, source })
        };
        Ok(Listeners {
            grpc: bind(settings.grpc_addr).await?,
            http: bind(settings.http_addr).await?,
        })
    }
}

/// Runs the service until `shutdown` resolves, then drains and returns.
///
/// # Errors
/// [`RunError`] when the rules at start are rejected or a server fails.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let telemetry = Arc::new(Telemetry::new()?);
    let (rules, files) = reload::load_path(&settings.config_path, settings.merge_domains)
        .map_err(RunError::Rules)?;
    tracing::info!(
        path = %settings.config_path.display(),
        rules = rules.rules().len(),
        "rules loaded"
    );
    telemetry.config_load(telemetry::ConfigLoad::Success);
    let sync_stop = CancellationToken::new();
    let global = match &settings.redis {
        Some(redis) => Some(
            global::start(
                redis,
                &settings,
                clock.clone(),
                &telemetry,
                sync_stop.clone(),
            )
            .await
            .map_err(RunError::Redis)?,
        ),
        None => None,
    };
    let limiter = RateLimiter::new(
        rules,
        files,
        clock,
        settings.options.clone(),
        telemetry.clone(),
        global.as_ref().map(|g| g.queues.clone()),
    );
    let reload_status = Arc::new(ReloadStatus::default());
    let readiness = Arc::new(Readiness::default());

    let background = CancellationToken::new();
    let watcher = reload::spawn_watcher(
        settings.config_path.clone(),
        settings.merge_domains,
        settings.reload_debounce,
        limiter.clone(),
        reload_status.clone(),
        background.clone(),
    )?;

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RlsService>>()
        .await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(grpc::FILE_DESCRIPTOR_SET)
    };
    let grpc_stop = CancellationToken::new();
    let grpc_addr = listeners.grpc.local_addr().ok();
    let mut grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(reflection().build_v1()?)
            .add_service(reflection().build_v1alpha()?)
            .add_service(RlsService::new(limiter.clone()).into_server())
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(listeners.grpc),
                grpc_stop.clone().cancelled_owned(),
            ),
    );
    let http_stop = CancellationToken::new();
    let http_addr = listeners.http.local_addr().ok();
    let state = http::AdminState {
        limiter: limiter.clone(),
        readiness: readiness.clone(),
        reload: reload_status,
        shards: global
            .as_ref()
            .map(|g| g.health.clone())
            .unwrap_or_default(),
    };
    let http_server = http::serve(
        listeners.http,
        http::router(state),
        http::HttpLimits::default(),
        http_stop.clone().cancelled_owned(),
    );
    let mut http_task = tokio::spawn(http_server);
    readiness.set(true);
    tracing::info!(grpc = ?grpc_addr, http = ?http_addr, "serving");

    let result = tokio::select! {
        _ = shutdown => Ok(()),
        r = &mut grpc_task => Err(match r {
            Ok(Err(e)) => RunError::Grpc(e),
            _ => RunError::Stopped("gRPC"),
        }),
        r = &mut http_task => Err(match r {
            Ok(Err(e)) => RunError::Http(e),
            _ => RunError::Stopped("HTTP"),
        }),
    };

    // Not ready first, so probes and balancers stop sending; then drain in-flight calls.
    readiness.set(false);
    health
        .set_not_serving::<RateLimitServiceServer<RlsService>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    grpc_stop.cancel();
    if !grpc_task.is_finished()
        && tokio::time::timeout(settings.shutdown_grace, &mut grpc_task)
            .await
            .is_err()
    {
        tracing::warn!(grace = ?settings.shutdown_grace, "grace period over; exiting with gRPC calls in flight");
        grpc_task.abort();
    }
    // Every hit counted is now in memory: flush them all to Redis before exiting.
    sync_stop.cancel();
    if let Some(g) = global {
        if tokio::time::timeout(settings.shutdown_grace, g.join())
            .await
            .is_err()
        {
            tracing::warn!("grace period over before the final flush finished");
        }
    }
    http_stop.cancel();
    if tokio::time::timeout(std::time::Duration::from_secs(1), &mut http_task)
        .await
        .is_err()
    {
        http_task.abort();
    }
    background.cancel();
    let _ = watcher.await;
    telemetry.shutdown();
    tracing::info!("stopped");
    result
}
