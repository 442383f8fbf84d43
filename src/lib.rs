//! sluice: an external rate-limit service for Envoy and Istio — envoyproxy/ratelimit's rules
//! and wire semantics, decided from memory.
//!
//! # Layout
//! Dependencies point one way (ARCHITECTURE.md, "Layers"; `tests/in_process/layers.rs` holds
//! them to it): the pure core (`core/`, `rules/`) imports nothing from the I/O edges
//! (`server/`, `sources/`, `global/`'s Redis, `cli/`). `rls/` uses the core, the rules,
//! `telemetry/`'s metric handles and `global/`'s exact-rule client and sync queues, never a
//! transport; `rlqs/` uses `rls/` and `global/`'s presence exchange besides.
//! - `core/`: time (`clock.rs`), the limit vocabulary (`limit.rs`), what a replica knows of
//!   the fleet (`fleet_view.rs`), window counters (`window/`), token buckets (`bucket/`, on
//!   `gcra.rs`), a limit's state (`state.rs`), pressure tiers and sync cadence (`tier.rs`),
//!   the entity table (`table/`), a rule's decision (`decide.rs`) and an exact limit's
//!   verdict on the store's counts (`exact.rs`). Pure: `now` is an argument.
//! - `rules/`: the rules YAML (`model/`), validation and compilation (`compile/`), the
//!   descriptor tree (`tree/`) and counter identity (`identity.rs`).
//! - `rls/`: the ShouldRateLimit semantics, transport-independent: validate → resolve →
//!   evaluate → respond (`validate.rs`, `resolve.rs`, `evaluate.rs`, `respond.rs`).
//! - `rlqs/`: Envoy's Rate Limit Quota Service, transport-independent: usage reports checked
//!   (`report.rs`), streams (`stream.rs`), one limit shared among them (`engine.rs`,
//!   `share.rs`); bucket ids resolve through the rules' tree (`RuleSet::find_bucket`).
//! - `global/`: global mode's sync (`sync/`: the store trait, per-shard queues, what the
//!   heartbeats say of the fleet (`fleet.rs`), the shard task, health, clock offset), Redis (`redis/`), exact rules' store
//!   calls (`exact/`), the fleet's presence exchange (`presence/`) and a replica's join
//!   (`join.rs`). Its settings are its own (`global::Config`); `global::spawn` starts it,
//!   handed the table, the fleet, the queues and the quota service's engine (`global::Parts`)
//!   that the wiring built once and handed the limiter and the quota service too.
//! - `server/`: gRPC (TLS/mTLS optional), HTTP admin and proto3 JSON, signals/readiness.
//! - `sources/`: where the rules come from: files (loaded, watched, reloaded) or xDS.
//! - `settings/`: the service's flags and environment; `telemetry/`: metrics (their names in
//!   `names.rs`), the reference's statsd and Prometheus names, OTLP traces and metrics, logs;
//!   `tls_files.rs`: PEM certificates, keys and CAs; `cli/`: the command line and the clients
//!   `check`, `query`, `explain`, `reset`, `load`; `sim/`: the fleet simulator behind
//!   `sluice simulate`.
//!
//! [`run`] wires them: load rules (or subscribe to them over xDS), serve gRPC and HTTP, watch
//! the rules, and on the shutdown future stop within one grace period: not ready, servers
//! drained, limiter closed, final flush. Each step of the start is a function of `wiring.rs`.
//! ARCHITECTURE.md walks through a request and a hit.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

/// This build: the package version and the commit it was built from (`build.rs`).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SLUICE_COMMIT"), ")");

/// The commit this build was made from: 12 hex digits, or `unknown` (`build.rs`).
pub const COMMIT: &str = env!("SLUICE_COMMIT");

pub mod cli;
pub mod core;
pub mod global;
pub mod rlqs;
pub mod rls;
pub mod rules;
pub mod server;
pub mod settings;
#[cfg(feature = "tools")]
pub mod sim;
pub mod sources;
pub mod telemetry;
pub mod tls_files;
mod wiring;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::Global;
use crate::rls::RateLimiter;
use crate::rules::model::ConfigError;
use crate::server::grpc::RlsService;
use crate::server::grpc_conn::InflightLimit;
use crate::server::http;
use crate::server::rlqs::QuotaService;
use crate::server::shutdown::Readiness;
use crate::settings::Settings;
use crate::sources::ReloadStatus;
use crate::telemetry::{otel, Telemetry};
use crate::wiring::{
    grpc_limits, load_rules, open_global, serve_grpc, serve_http, set_health, spawn_reporters,
    spawn_rules_source, spawn_sweeper, start_global, start_quotas, turn_ready, ServerTask, Shared,
};
use opentelemetry_sdk::metrics::SdkMeterProvider;

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
    /// An OTLP exporter (traces or metrics) could not be built.
    #[error("{0}")]
    Otel(#[from] otel::OtelError),
    /// The rules directory cannot be watched.
    #[error("cannot watch the rules: {0}")]
    Watch(#[from] notify::Error),
    /// Reflection could not be set up from the descriptor set.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    /// A server task ended without an error of its own (it panicked or was cancelled).
    #[error("{0} server stopped unexpectedly")]
    Stopped(&'static str),
    /// The Redis settings are unusable.
    #[error("redis: {0}")]
    Redis(#[from] global::OpenError),
    /// The gRPC TLS files or settings are unusable.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] server::tls::TlsError),
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

/// Runs the service until `shutdown` resolves, then stops it within `SHUTDOWN_GRACE`.
///
/// # Errors
/// [`RunError`] when the rules at start are rejected or a server fails.
pub async fn run(
    settings: Settings,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let mut service = Service::start(&settings, listeners, clock).await?;
    let result = service.serve_until(shutdown).await;
    service
        .stop(settings.shutdown_grace, settings.sync.timeout)
        .await;
    result
}

/// The running service: what `run` started and must stop.
struct Service {
    limiter: Arc<RateLimiter>,
    telemetry: Arc<Telemetry>,
    tracer: Option<Arc<otel::Tracer>>,
    readiness: Arc<Readiness>,
    health: wiring::Health,
    grpc: ServerTask<std::convert::Infallible>,
    /// The gRPC port's requests in flight: shutdown waits for the unary calls here.
    inflight: InflightLimit,
    /// Stop the quota service's streams' counting, then end them.
    rlqs_stops: server::rlqs::Stops,
    http: ServerTask<std::io::Error>,
    global: Option<Global>,
    sync_stop: CancellationToken,
    /// Where new rules come from: the file watcher, or the xDS client.
    rules_source: JoinHandle<()>,
    /// The task that turns the service ready once the fleet's join is over (global mode) and
    /// as the accepted sets say (xDS), stopped before shutdown turns the service unready (so
    /// it cannot turn it ready again).
    readiness_gate: Option<ServerTask<std::convert::Infallible>>,
    background: CancellationToken,
}

// === impl Service ===

impl Service {
    /// Loads the rules, starts global mode (if configured), the gRPC and HTTP servers and the
    /// rules watcher, then turns ready (in global mode, once the replica joined the fleet).
    async fn start(
        settings: &Settings,
        listeners: Listeners,
        clock: Arc<dyn Clock>,
    ) -> Result<Service, RunError> {
        let resource = settings.otlp.resource();
        let meters = settings
            .otlp
            .metrics_reader(&resource, SdkMeterProvider::builder())?;
        let telemetry = Arc::new(Telemetry::with_builder(meters)?);
        if settings.otlp.metrics {
            telemetry.export_rule_counters();
        }
        let tracer = if settings.otlp.tracing {
            match otel::Tracer::new(&settings.otlp, resource) {
                Ok(t) => Some(Arc::new(t)),
                Err(e) => {
                    flush_exporters(telemetry, None).await;
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        if tracer.is_some() {
            tracing::info!(protocol = ?settings.otlp.protocol, endpoint = %settings.otlp.endpoints.traces(settings.otlp.protocol), sampling_rate = settings.otlp.sampling_rate, "tracing on");
        }
        let started = Self::start_with(
            settings,
            listeners,
            clock,
            telemetry.clone(),
            tracer.clone(),
        )
        .await;
        if started.is_err() {
            // Stopped here rather than dropped: an exporter's drop blocks on its own task,
            // which a blocked runtime thread could never run.
            flush_exporters(telemetry, tracer).await;
        }
        started
    }

    /// [`Service::start`] once the metrics and trace pipelines exist: the rules, global mode,
    /// the limiter, the rules source and background tasks, the servers; then ready.
    async fn start_with(
        settings: &Settings,
        listeners: Listeners,
        clock: Arc<dyn Clock>,
        telemetry: Arc<Telemetry>,
        tracer: Option<Arc<otel::Tracer>>,
    ) -> Result<Service, RunError> {
        let (rules, files) = load_rules(settings, &telemetry).await?;
        let sync_stop = CancellationToken::new();
        // Built once, handed to global mode, the limiter and the quota service.
        let shared = Shared::new(settings);
        let (opened, mode) = open_global(settings, &shared)?.unzip();
        let limiter = RateLimiter::new(
            rules,
            files,
            clock.clone(),
            settings.options.clone(),
            telemetry.clone(),
            shared.table.clone(),
            mode,
        );
        let quotas = start_quotas(settings, &limiter, &shared.fleet, &telemetry);
        // Started once the quota service exists (it is handed its engine), and before the
        // rules source and the sweeper, which read the clock it corrects.
        let global = match opened {
            Some(opened) => {
                let quotas = quotas.as_ref();
                Some(start_global(opened, &shared, quotas, clock, &telemetry, &sync_stop).await)
            }
            None => None,
        };
        let reload_status = Arc::new(ReloadStatus::default());
        if settings.xds.is_none() {
            // The rules loaded above are the first load: `/rlconfig/status` counts it, as
            // `sluice_config_load_total` does. Over xDS the first set counts when it comes.
            reload_status.succeeded();
        }
        let background = CancellationToken::new();
        let (rules_source, loaded) =
            spawn_rules_source(settings, &limiter, &reload_status, &background)?;
        spawn_sweeper(limiter.clone(), background.clone());
        spawn_reporters(settings, &telemetry, &background).await?;
        let rlqs_stops = server::rlqs::Stops::default();
        let (health, health_service) = wiring::Health::new(quotas.is_some());
        // Serving at once only with nothing to wait for: rules over xDS, or (global mode) the
        // fleet's join, turn it on when they are in (`turn_ready`).
        set_health(&health, settings.xds.is_none() && global.is_none()).await;
        // Logged as `0.0.0.0:8081`; a listener that cannot say its address (it always can once
        // bound) shows what it was asked to bind.
        let grpc_addr = listeners.grpc.local_addr().unwrap_or(settings.grpc_addr);
        let http_addr = listeners.http.local_addr().unwrap_or(settings.http_addr);
        let (grpc, inflight) = serve_grpc(
            listeners.grpc,
            settings.grpc_tls.as_ref(),
            grpc_limits(settings),
            health_service,
            RlsService::new(limiter.clone()).with_tracer(tracer.clone()),
            quotas
                .clone()
                .map(|q| QuotaService::new(q, rlqs_stops.clone())),
        )?;
        let readiness = Arc::new(Readiness::default());
        let state = http::AdminState {
            limiter: limiter.clone(),
            readiness: readiness.clone(),
            reload: reload_status,
            shards: global
                .as_ref()
                .map(|g| g.health.clone())
                .unwrap_or_default(),
            fleet: global.as_ref().map(|g| g.joining.clone()),
            tracer: tracer.clone(),
            admin_token: settings.admin_token.clone().map(Arc::new),
            open_reads: settings.admin_open_reads,
            quotas,
            status_sources: Arc::default(),
        };
        let http = serve_http(listeners.http, state, settings);
        let joining = global.as_ref().map(|g| g.joining.clone());
        let readiness_gate = turn_ready(settings, loaded, &readiness, &health, joining);
        tracing::info!(grpc = %grpc_addr, http = %http_addr, "serving");
        Ok(Service {
            limiter,
            telemetry,
            tracer,
            readiness,
            health,
            grpc,
            inflight,
            rlqs_stops,
            http,
            global,
            sync_stop,
            rules_source,
            readiness_gate,
            background,
        })
    }

    /// Waits for `shutdown`, or for a server to fail.
    async fn serve_until(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
        tokio::select! {
            _ = shutdown => Ok(()),
            r = &mut self.grpc.task => Err(match r {
                Ok(Err(never)) => match never {},
                _ => RunError::Stopped("gRPC"),
            }),
            r = &mut self.http.task => Err(match r {
                Ok(Err(e)) => RunError::Http(e),
                _ => RunError::Stopped("HTTP"),
            }),
        }
    }

    /// Stops within one deadline, `grace` from now (ARCHITECTURE.md, "Invariants"): not
    /// ready; both servers stop taking and finish their calls (the quota streams stay open);
    /// the limiter closes and the quota streams stop counting, so nothing is decided after
    /// the final flush (not even over HTTP); every shard flushes; then the quota streams end,
    /// so their Envoys reconnect to a replica that reads this one's counts. The servers get
    /// the grace less what the flush may need (one store call per shard, bounded by
    /// `store_timeout`), so the whole stop fits the pod's `terminationGracePeriodSeconds`.
    async fn stop(self, grace: Duration, store_timeout: Duration) {
        let deadline = Instant::now() + grace;
        let drain_deadline = deadline - flush_reserve(grace, store_timeout);
        if let Some(gate) = self.readiness_gate {
            gate.stop.cancel();
            let _ = gate.task.await;
        }
        self.readiness.set(false);
        set_health(&self.health, false).await;
        self.grpc.stop.cancel();
        self.http.stop.cancel();
        let (mut grpc, mut http) = (self.grpc.task, self.http.task);
        let drained = tokio::time::timeout_at(drain_deadline, async {
            self.inflight.drained().await;
            let _ = (&mut http).await;
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                ?grace,
                "grace period nearly over; closing connections with calls in flight"
            );
            http.abort();
        }
        // From here on nothing is counted: every hit is in memory, for the flush to send.
        self.limiter.close();
        self.rlqs_stops.closing.cancel();
        self.sync_stop.cancel();
        if let Some(g) = self.global {
            if tokio::time::timeout_at(deadline, g.join()).await.is_err() {
                tracing::warn!("grace period over before the final flush finished");
            }
        }
        self.rlqs_stops.end.cancel();
        if tokio::time::timeout_at(deadline, &mut grpc).await.is_err() {
            grpc.abort();
        }
        self.background.cancel();
        let _ = self.rules_source.await;
        flush_exporters(self.telemetry, self.tracer).await;
        tracing::info!("stopped");
    }
}

/// Sends the last spans and metrics (every call has ended by now) and stops the exporters.
/// The SDK's shutdown blocks until its export task (on this runtime) answers, so it runs on a
/// blocking thread; a collector that does not answer costs [`otel::FLUSH_TIMEOUT`], no more.
async fn flush_exporters(telemetry: Arc<Telemetry>, tracer: Option<Arc<otel::Tracer>>) {
    let flush = tokio::task::spawn_blocking(move || {
        if let Some(t) = tracer {
            t.shutdown();
        }
        telemetry.shutdown();
    });
    if tokio::time::timeout(otel::FLUSH_TIMEOUT, flush)
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?otel::FLUSH_TIMEOUT, "the OTLP collector did not take the last spans and metrics in time");
    }
}

/// How much of the grace period the final flush keeps for itself: each shard sends one call
/// bounded by the store timeout (twice it, for the lock work around it), at most half the
/// grace so the servers always get the other half.
fn flush_reserve(grace: Duration, store_timeout: Duration) -> Duration {
    (store_timeout * 2 + Duration::from_millis(100)).min(grace / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_keeps_what_it_needs_but_never_more_than_half_the_grace() {
        let ms = Duration::from_millis;
        assert_eq!(flush_reserve(ms(20_000), ms(100)), ms(300));
        assert_eq!(flush_reserve(ms(1_000), ms(5_000)), ms(500));
    }
}
