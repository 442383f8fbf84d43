//! The steps `Service::start` (lib.rs) takes, each a piece of the running service: the rules
//! at start, the parts built once and handed down ([`Shared`]: the entity table and the
//! fleet), global mode opened (its stores and the queues for them), the limiter and the
//! quota service's state on them, then global mode started and handed the quota service's
//! engine; the rules source (files or xDS), the reference's metric outlets, the gRPC and
//! HTTP servers, gRPC health and readiness (after the fleet's join in global mode, and as
//! xDS says), the idle-entity sweeper.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::core::table::EntityTable;
use crate::global::redis::RedisStore;
use crate::global::{
    self, Fleet, Global, Joining, Parts, PresenceSource, Stores, SyncConfig, SyncQueues,
};
use crate::rlqs::{self, published::Published, Quotas};
use crate::rls::{GlobalMode, RateLimiter};
use crate::rules::{self, model::ConfigError};
use crate::server::grpc::{self, RlsService};
use crate::server::grpc_conn::{GrpcLimits, InflightLimit};
use crate::server::rlqs::QuotaService;
use crate::server::shutdown::Readiness;
use crate::server::{self, http};
use crate::settings::Settings;
use crate::sources::files as reload;
use crate::sources::xds::{XdsClient, XdsSettings};
use crate::sources::ReloadStatus;
use crate::telemetry::{self, Telemetry};
use crate::RunError;

/// A server task and the token that stops it.
pub(crate) struct ServerTask<E> {
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<Result<(), E>>,
}

/// The rules at start: from the files (a first load, counted), or none until the xDS
/// management server sends a set.
pub(crate) async fn load_rules(
    settings: &Settings,
    telemetry: &Telemetry,
) -> Result<(rules::RuleSet, Vec<String>), RunError> {
    if let Some(xds) = &settings.xds {
        // No rules until the management server sends a set: every request is allowed
        // meanwhile, and the service is not ready (docs/operations.md, "Rules over xDS").
        tracing::info!(url = %xds.server_url, node = %xds.node_id, "rules come over xDS");
        return Ok((rules::RuleSet::default(), Vec::new()));
    }
    // On a blocking thread, as every later reload: other tasks (exporters, a caller's own)
    // share this runtime.
    let (path, options) = (settings.config_path.clone(), settings.rules);
    let (rules, files) = tokio::task::spawn_blocking(move || reload::load_path(&path, options))
        .await
        .unwrap_or_else(|e| {
            Err(vec![ConfigError::new(
                "rules",
                format!("the load did not finish: {e}"),
            )])
        })
        .map_err(RunError::Rules)?;
    tracing::info!(path = %settings.config_path.display(), rules = rules.rules().len(), "rules loaded");
    telemetry.config_load(telemetry::ConfigLoad::Success);
    Ok((rules, files))
}

/// What the wiring builds once and hands down: the entity table (the limiter counts in it,
/// global mode's sync reads and settles it) and what this replica knows of the fleet (the
/// sync writes it, the limiter and the quota service read it). Nothing is attached later.
pub(crate) struct Shared {
    pub(crate) table: EntityTable,
    pub(crate) fleet: Arc<Fleet>,
}

impl Shared {
    /// The table sized by the settings, and a fleet of this replica alone so far, its id
    /// drawn at random (a restarted replica is a new one).
    pub(crate) fn new(settings: &Settings) -> Shared {
        Shared {
            table: EntityTable::new(settings.options.cache),
            fleet: Arc::new(Fleet::new(global::new_replica_id())),
        }
    }
}

/// Global mode opened but not started: its stores (nothing dialled yet), the queues for
/// them, its sync's settings.
pub(crate) struct Opened {
    sync: SyncConfig,
    stores: Stores<RedisStore>,
    queues: Arc<SyncQueues>,
}

/// Global mode, when a Redis is set: its stores opened, and the limiter's ways to it (the
/// queues for them, the shared fleet, the exact rules' client), so that the limiter and
/// the quota service are built before global mode starts ([`start_global`]).
pub(crate) fn open_global(
    settings: &Settings,
    shared: &Shared,
) -> Result<Option<(Opened, GlobalMode)>, RunError> {
    let Some(config) = settings.global() else {
        return Ok(None);
    };
    let (stores, exact) = global::connect(&config)?;
    let queues = stores.queues(&config.sync);
    let mode = GlobalMode {
        queues: queues.clone(),
        fleet: shared.fleet.clone(),
        exact: Some(exact),
    };
    let opened = Opened {
        sync: config.sync,
        stores,
        queues,
    };
    Ok(Some((opened, mode)))
}

/// Starts global mode on what [`open_global`] opened, the shared table and fleet, and the
/// quota service's engine when it is on (its streams per counter exchanged with the fleet
/// every sync tick); its tasks stop on `stop`.
pub(crate) async fn start_global(
    opened: Opened,
    shared: &Shared,
    quotas: Option<&Arc<Quotas>>,
    clock: Arc<dyn Clock>,
    telemetry: &Telemetry,
    stop: &CancellationToken,
) -> Global {
    let presence = quotas.map(|q| Arc::new(Published(q.clone())) as Arc<dyn PresenceSource>);
    let parts = Parts {
        table: shared.table.clone(),
        fleet: shared.fleet.clone(),
        queues: opened.queues,
        presence,
    };
    global::spawn(
        opened.sync,
        opened.stores,
        parts,
        clock,
        telemetry,
        stop.clone(),
    )
    .await
}

/// The quota service's state, when it is on, with its metrics registered: built before
/// global mode starts, which is handed it ([`start_global`]).
pub(crate) fn start_quotas(
    settings: &Settings,
    limiter: &Arc<RateLimiter>,
    fleet: &Arc<Fleet>,
    telemetry: &Telemetry,
) -> Option<Arc<Quotas>> {
    let quotas = Quotas::new(limiter.clone(), settings.rlqs.clone()?, fleet.clone());
    rlqs::register_metrics(telemetry, &quotas);
    Some(quotas)
}

/// Where new rules come from until `stop`: the xDS client (and the channel its accepted sets'
/// domain counts come on), or the rules directory's watcher.
pub(crate) fn spawn_rules_source(
    settings: &Settings,
    limiter: &Arc<RateLimiter>,
    status: &Arc<ReloadStatus>,
    stop: &CancellationToken,
) -> Result<(JoinHandle<()>, watch::Receiver<Option<usize>>), RunError> {
    let (loaded_tx, loaded) = watch::channel(None);
    let task = match &settings.xds {
        Some(xds) => {
            let client = XdsClient {
                settings: xds.clone(),
                rules: settings.rules,
                limiter: limiter.clone(),
                status: status.clone(),
            };
            tokio::spawn(client.run(loaded_tx, stop.clone()))
        }
        None => reload::spawn_watcher(
            settings.config_path.clone(),
            settings.rules,
            settings.reload_debounce,
            limiter.clone(),
            status.clone(),
            stop.clone(),
        )?,
    };
    Ok((task, loaded))
}

/// The reference's metric outlets, when on: statsd, and the Prometheus port.
pub(crate) async fn spawn_reporters(
    settings: &Settings,
    telemetry: &Arc<Telemetry>,
    stop: &CancellationToken,
) -> Result<(), RunError> {
    if let Some(statsd) = &settings.statsd {
        telemetry::statsd::spawn(statsd.clone(), telemetry.clone(), stop.clone());
    }
    if let Some(p) = &settings.prometheus {
        let listener = TcpListener::bind(p.addr)
            .await
            .map_err(|source| RunError::Bind {
                addr: p.addr,
                source,
            })?;
        let router = telemetry::prometheus_ref::router(&p.path, telemetry.clone());
        tokio::spawn(http::serve(
            listener,
            router,
            http_limits(settings),
            stop.clone().cancelled_owned(),
        ));
    }
    Ok(())
}

/// The gRPC port's bounds, its connections fitted to the open-files limit.
pub(crate) fn grpc_limits(settings: &Settings) -> GrpcLimits {
    GrpcLimits {
        // Room for the admin port's connections, Redis, the rules' files and the rest.
        max_connections: server::nofile::fit_connections(
            settings.grpc_limits.max_connections,
            settings.http_max_connections + 256,
        ),
        ..settings.grpc_limits
    }
}

/// The gRPC health service name envoyproxy/ratelimit answers for: probes and Envoy health
/// checks written for it ask for this name rather than the RLS service's full name.
const REFERENCE_HEALTH_NAME: &str = "ratelimit";

/// The gRPC health reporter, and whether the quota service is served (its name reports
/// only then).
#[derive(Clone)]
pub(crate) struct Health {
    reporter: tonic_health::server::HealthReporter,
    rlqs: bool,
}

impl Health {
    /// The reporter, and the health service it answers through.
    pub(crate) fn new(
        rlqs: bool,
    ) -> (
        Health,
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    ) {
        let (reporter, service) = tonic_health::server::health_reporter();
        (Health { reporter, rlqs }, service)
    }
}

/// Sets the gRPC health of the RLS service (and the quota service, when served), of the
/// whole server (""), and of the reference's name.
pub(crate) async fn set_health(health: &Health, serving: bool) {
    let status = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    let names = [grpc::RLS_SERVICE, "", REFERENCE_HEALTH_NAME];
    let quota = health.rlqs.then_some(grpc::RLQS_SERVICE);
    for name in names.into_iter().chain(quota) {
        health.reporter.set_service_status(name, status).await;
    }
}

/// Turns the service ready: with rules from files, at once, or in global mode once the
/// replica has joined the fleet (`joining`: the running replicas count it, `global/join.rs`);
/// over xDS, as the sets the client accepts say, from then on. Returns the task that does so
/// when there is one, for `stop` to end first.
pub(crate) fn turn_ready(
    settings: &Settings,
    loaded: watch::Receiver<Option<usize>>,
    readiness: &Arc<Readiness>,
    health: &Health,
    joining: Option<Joining>,
) -> Option<ServerTask<std::convert::Infallible>> {
    match (&settings.xds, joining) {
        (Some(xds), joining) => Some(spawn_xds_readiness(
            xds,
            loaded,
            readiness.clone(),
            health.clone(),
            joining,
        )),
        (None, Some(joining)) => Some(spawn_join_readiness(
            joining,
            readiness.clone(),
            health.clone(),
        )),
        (None, None) => {
            readiness.set(true);
            None
        }
    }
}

/// Global mode, rules from files: ready (and gRPC health serving) once the join is over.
fn spawn_join_readiness(
    joining: Joining,
    readiness: Arc<Readiness>,
    health: Health,
) -> ServerTask<std::convert::Infallible> {
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = token.cancelled() => return Ok(()),
            _ = joining.done() => {}
        }
        readiness.set(true);
        set_health(&health, true).await;
        Ok(())
    });
    ServerTask { stop, task }
}

/// xDS: readiness (and gRPC health) follow the sets the client accepts, once the replica
/// joined the fleet (global mode): not ready until the first one, unless `force_start`; with
/// `need_a_domain`, ready only while the set in force has a domain (the reference's
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
fn spawn_xds_readiness(
    xds: &XdsSettings,
    mut loaded: watch::Receiver<Option<usize>>,
    readiness: Arc<Readiness>,
    health: Health,
    joining: Option<Joining>,
) -> ServerTask<std::convert::Infallible> {
    let (force_start, need_a_domain) = (xds.force_start, xds.need_a_domain);
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        if let Some(joining) = joining {
            tokio::select! {
                _ = token.cancelled() => return Ok(()),
                _ = joining.done() => {}
            }
        }
        let mut last = None;
        loop {
            let ready = match *loaded.borrow_and_update() {
                None => force_start,
                Some(domains) => !need_a_domain || domains > 0,
            };
            if last != Some(ready) {
                if ready {
                    tracing::info!("ready: rules over xDS in force");
                } else {
                    tracing::info!("not ready: no rules over xDS in force yet");
                }
                readiness.set(ready);
                set_health(&health, ready).await;
                last = Some(ready);
            }
            tokio::select! {
                _ = token.cancelled() => return Ok(()),
                changed = loaded.changed() => if changed.is_err() { return Ok(()) },
            }
        }
    });
    ServerTask { stop, task }
}

/// Sweeps idle entities out of the table once a second until `stop` (on a blocking thread:
/// a slice of a full table takes a few milliseconds).
pub(crate) fn spawn_sweeper(limiter: Arc<RateLimiter>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = every.tick() => {
                    let limiter = limiter.clone();
                    let _ = tokio::task::spawn_blocking(move || limiter.sweep()).await;
                }
            }
        }
    });
}

/// Starts the gRPC server: the RLS service, the quota service (when given), health and
/// reflection; over TLS when `tls` is set. Returns the task and its bound on requests in
/// flight, which tells shutdown when the unary calls are done.
pub(crate) fn serve_grpc(
    listener: TcpListener,
    tls: Option<&server::tls::GrpcTls>,
    limits: GrpcLimits,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    rls: RlsService,
    quota: Option<QuotaService>,
) -> Result<(ServerTask<Infallible>, InflightLimit), RunError> {
    // What reflection lists: the services registered below, the quota service when it is on.
    let mut served = vec![grpc::RLS_SERVICE];
    if quota.is_some() {
        served.push(grpc::RLQS_SERVICE);
    }
    let (v1, v1alpha) = (
        tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
        tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
    );
    let stop = CancellationToken::new();
    let inflight = server::grpc_conn::InflightLimit::new(
        limits.max_concurrent_requests,
        limits.request_timeout,
    );
    let routes = tonic::service::Routes::new(health)
        .add_service(grpc::reflection(&served).with_service_name(v1).build_v1()?)
        .add_service(
            grpc::reflection(&served)
                .with_service_name(v1alpha)
                .build_v1alpha()?,
        )
        .add_service(rls.clone().into_server());
    let routes = match quota {
        Some(quota) => routes.add_service(quota.into_server()),
        None => routes,
    };
    let dispatch = server::grpc_serve::Dispatch::new(rls, routes.prepare(), inflight.clone());
    let streams = limits.max_concurrent_streams;
    let signal = stop.clone().cancelled_owned();
    let task = match tls {
        Some(tls) => {
            let handshake = server::tls::handshake(server::tls::server_config(tls)?);
            let incoming = server::grpc_conn::incoming(listener, limits, handshake);
            tokio::spawn(async move {
                server::grpc_serve::serve(incoming, dispatch, streams, signal).await;
                Ok(())
            })
        }
        None => {
            let incoming =
                server::grpc_conn::incoming(listener, limits, |tcp| std::future::ready(Ok(tcp)));
            tokio::spawn(async move {
                server::grpc_serve::serve(incoming, dispatch, streams, signal).await;
                Ok(())
            })
        }
    };
    Ok((ServerTask { stop, task }, inflight))
}

/// The HTTP listeners' bounds (the admin port, and the reference's Prometheus port).
pub(crate) fn http_limits(settings: &Settings) -> http::HttpLimits {
    http::HttpLimits {
        header_read_timeout: settings.http_header_read_timeout,
        idle_timeout: settings.http_idle_timeout,
        max_connections: settings.http_max_connections,
    }
}

/// Starts the HTTP admin server, with the connection limits that keep it from starving gRPC.
pub(crate) fn serve_http(
    listener: TcpListener,
    state: http::AdminState,
    settings: &Settings,
) -> ServerTask<std::io::Error> {
    let stop = CancellationToken::new();
    let server = http::serve(
        listener,
        http::router(state),
        http_limits(settings),
        stop.clone().cancelled_owned(),
    );
    ServerTask {
        stop,
        task: tokio::spawn(server),
    }
}
