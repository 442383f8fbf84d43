//! sluice's fleet under simulation: each replica is the production code — a
//! [`RateLimiter`] in global mode answering `ShouldRateLimit` (and, for the quota scenarios,
//! the quota service's [`Quotas`] on it), built on the table, fleet and queues it then hands
//! `global::spawn` as the service's wiring does (the supervised sync task running its real
//! loop — tick, tier cadence, backoff — the clock-offset task, the presence loop when
//! quotas are served) against the shared [`SimStore`] — on a clock read from tokio's paused
//! time.
//!
//! Nothing of the mechanism is modelled here: this file only starts the pieces and turns a
//! scenario's limit into a rules file. The store's `TIME` moves no simulated clock (a
//! [`SimClock`] keeps no offset), so the offset task changes no number.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::SimStore;
use crate::core::clock::{Clock, UnixMillis};
use crate::core::table::EntityTable;
use crate::core::{Algorithm, Limit, SyncPolicy};
use crate::global::{self, Joining, Parts, PresenceSource, Stores, SyncConfig, SyncSettings};
use crate::rlqs::published::Published;
use crate::rlqs::{self, Quotas};
use crate::rls::{GlobalMode, Options, RateLimiter};
use crate::telemetry::Telemetry;

/// A node's clock: Unix time `t0` at the instant `zero` of tokio's clock, moving with it,
/// before `zero` too (a replica starting before the traffic states the time of each
/// heartbeat, which a replica joining the fleet watches change). Under paused time the
/// decisions and the sync task read the same simulated time, and no wall clock is involved.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    /// The Unix time at `zero`.
    pub t0: UnixMillis,
    /// The tokio instant the simulated run calls `t0`.
    pub zero: Instant,
}

impl Clock for SimClock {
    fn now(&self) -> UnixMillis {
        let now = Instant::now();
        let after = now.saturating_duration_since(self.zero).as_millis() as u64;
        let before = self.zero.saturating_duration_since(now).as_millis() as u64;
        UnixMillis(self.t0.0 + after - before)
    }
}

/// The rules file every replica loads: domain `sim`, key `k`, the scenario's limit; a sliding
/// window `strict` (a rule's default: denied hits count too) or `strict: false` (denied hits
/// cost nothing), as the exact model (`exact.rs`) counts the scenario. Most scenarios run
/// `strict: false`: a strict sliding window under their sustained overload admits nothing
/// after the first window — the denied hits keep the count over, for the exact limiter too —
/// so the fleet's sharing of the room would go unmeasured past a cold start.
///
/// # Panics
/// When the limit's window is not a whole number of seconds (no rules file can say it).
pub fn rules_yaml(limit: &Limit, strict: bool) -> String {
    assert!(
        limit.window_ms >= 1000 && limit.window_ms.is_multiple_of(1000),
        "a rules file cannot express a window of {} ms",
        limit.window_ms
    );
    let secs = limit.window_ms / 1000;
    let (unit, multiplier) = [("day", 86_400), ("hour", 3_600), ("minute", 60)]
        .into_iter()
        .find(|&(_, s)| secs.is_multiple_of(s))
        .map_or(("second", secs), |(u, s)| (u, secs / s));
    let algorithm = match limit.algorithm {
        Algorithm::SlidingWindow if strict => "sliding_window".to_string(),
        Algorithm::SlidingWindow => "sliding_window, strict: false".to_string(),
        Algorithm::FixedWindow => "fixed_window".to_string(),
        Algorithm::TokenBucket { burst } => format!("token_bucket, burst: {burst}"),
        Algorithm::Concurrency => "concurrency".to_string(),
    };
    format!(
        "domain: sim\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, \
         unit_multiplier: {multiplier}, requests_per_unit: {}, algorithm: {algorithm}}}\n",
        limit.requests_per_unit
    )
}

/// The one request of the run: one hit on entity `k=e` of domain `sim`.
fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "sim".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "e".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// One replica of a run: what it serves once it has started (set once: a replica of
/// [`Fleet::start_at`] starts during the run), and whether it reports ready.
#[derive(Default)]
struct Node {
    started: OnceLock<Started>,
    /// What a load balancer routes by: set as the service sets its readiness.
    ready: AtomicBool,
}

/// What a started replica serves.
struct Started {
    limiter: Arc<RateLimiter>,
    /// The quota service on the limiter, when the run serves quotas (`rlqs.rs`).
    quotas: Option<Arc<Quotas>>,
}

/// What every replica of a run starts from.
#[derive(Clone)]
struct Recipe {
    yaml: String,
    settings: SyncSettings,
    clock: SimClock,
    store: Arc<SimStore>,
    /// The quota service's settings, when the replicas serve quotas.
    quotas: Option<rlqs::Config>,
}

impl Recipe {
    fn new(
        limit: &Limit,
        strict: bool,
        tick_ms: u64,
        clock: SimClock,
        store: &Arc<SimStore>,
    ) -> Self {
        Recipe {
            yaml: rules_yaml(limit, strict),
            settings: SyncSettings {
                policy: SyncPolicy {
                    tick_ms,
                    ..SyncPolicy::default()
                },
                ..SyncSettings::default()
            },
            clock,
            store: store.clone(),
            quotas: None,
        }
    }

    /// Starts replica `node` as the service's wiring does: the table, the fleet and the
    /// queues (one shard) built once, the limiter (and the quota service) on them, then global
    /// mode handed them, its sync task's first run `first_run_after` from now, joining the
    /// fleet when `join`; `node` is set once started. Returns what the service's readiness
    /// waits for.
    async fn start(
        &self,
        index: usize,
        node: &Node,
        first_run_after: Duration,
        join: bool,
        stop: CancellationToken,
    ) -> Joining {
        let rules = crate::rules::compile_sources(&[("sim.yaml".into(), self.yaml.clone())], false)
            .unwrap_or_else(|e| panic!("simulated rules: {e:?}"));
        let telemetry = Arc::new(Telemetry::new().expect("a metrics pipeline"));
        let config = SyncConfig {
            first_run_after,
            // A fleet already running joined long ago; one that starts in the run joins as
            // the service does, with the service's default timeout.
            join_timeout: if join {
                default_join_timeout()
            } else {
                Duration::ZERO
            },
            ..SyncConfig::new(self.settings, 1_000_000) // SYNC_MAX_QUEUED's default
        };
        let stores = Stores::one(self.store.clone());
        // The replica's id distinct and the same on every run, where production draws one
        // at random.
        let parts = Parts {
            table: EntityTable::new(Options::default().cache),
            fleet: Arc::new(global::Fleet::new(index as u64 + 1)),
            queues: stores.queues(&config),
            presence: None,
        };
        let clock: Arc<dyn Clock> = Arc::new(self.clock);
        let limiter = RateLimiter::new(
            rules,
            vec![],
            clock.clone(),
            Options::default(),
            telemetry.clone(),
            parts.table.clone(),
            Some(GlobalMode {
                queues: parts.queues.clone(),
                fleet: parts.fleet.clone(),
                exact: None,
            }),
        );
        let quotas = (self.quotas.clone())
            .map(|config| Quotas::new(limiter.clone(), config, parts.fleet.clone()));
        let presence = (quotas.clone()).map(|q| Arc::new(Published(q)) as Arc<dyn PresenceSource>);
        let parts = Parts { presence, ..parts };
        let global = global::spawn(config, stores, parts, clock, &telemetry, stop).await;
        let _ = node.started.set(Started { limiter, quotas });
        global.joining
    }
}

/// `SYNC_JOIN_TIMEOUT`'s default, as `sluice serve` has it.
fn default_join_timeout() -> Duration {
    crate::settings::spec_of("SYNC_JOIN_TIMEOUT")
        .and_then(|s| s.default)
        .and_then(|d| humantime::parse_duration(d).ok())
        .expect("SYNC_JOIN_TIMEOUT has a default")
}

/// The replicas of one run, their sync tasks started.
pub struct Fleet {
    nodes: Vec<Arc<Node>>,
    /// Each replica's shutdown: cancelled, its sync task makes its final flush (which
    /// removes its heartbeat), as at SIGTERM.
    stops: Vec<CancellationToken>,
    request: RateLimitRequest,
}

impl Fleet {
    /// Starts `phases.len()` replicas on `store`, each deciding on a [`SimClock`] and each
    /// sync task starting after its own phase: a fleet already running, ready from the
    /// start. Must run inside the simulation's runtime.
    ///
    /// # Panics
    /// When the limit makes no valid rules file (see [`rules_yaml`]).
    pub async fn start(
        limit: &Limit,
        strict: bool,
        tick_ms: u64,
        clock: SimClock,
        store: &Arc<SimStore>,
        phases: &[u64],
    ) -> Fleet {
        let recipe = Recipe::new(limit, strict, tick_ms, clock, store);
        let fleet = Fleet::start_running(&recipe, phases).await;
        debug_assert_eq!(fleet.limit_in_force(), Some(*limit));
        fleet
    }

    /// Like [`Fleet::start`] (rules `strict: false`), each replica serving quotas too: the
    /// quota service with `config` on its limiter, its engine handed to global mode as the
    /// service's wiring hands it ([`Fleet::quotas`]).
    pub async fn start_serving_quotas(
        limit: &Limit,
        tick_ms: u64,
        clock: SimClock,
        store: &Arc<SimStore>,
        phases: &[u64],
        config: rlqs::Config,
    ) -> Fleet {
        let recipe = Recipe {
            quotas: Some(config),
            ..Recipe::new(limit, false, tick_ms, clock, store)
        };
        let fleet = Fleet::start_running(&recipe, phases).await;
        debug_assert_eq!(fleet.limit_in_force(), Some(*limit));
        fleet
    }

    /// Starts a fleet already running of `recipe`'s replicas, one per phase (see
    /// [`Fleet::start`]).
    async fn start_running(recipe: &Recipe, phases: &[u64]) -> Fleet {
        let fleet = Fleet::empty(phases.len());
        for (index, &phase) in phases.iter().enumerate() {
            let node = &fleet.nodes[index];
            let after = Duration::from_millis(phase);
            let stop = fleet.stops[index].clone();
            recipe.start(index, node, after, false, stop).await;
            node.ready.store(true, Ordering::Relaxed);
        }
        fleet
    }

    /// Starts replica `i` at `zero + starts[i]` ms (at most two ticks before `zero`: the
    /// runtime's start), as the service starts, its sync task at once; each reports ready as
    /// the service does. Must run inside the simulation's runtime.
    pub fn start_at(
        limit: &Limit,
        strict: bool,
        tick_ms: u64,
        clock: SimClock,
        store: &Arc<SimStore>,
        starts: &[i64],
    ) -> Fleet {
        let recipe = Recipe::new(limit, strict, tick_ms, clock, store);
        let fleet = Fleet::empty(starts.len());
        for (index, &at) in starts.iter().enumerate() {
            let at = match u64::try_from(at) {
                Ok(after) => clock.zero + Duration::from_millis(after),
                Err(_) => clock.zero - Duration::from_millis(at.unsigned_abs()),
            };
            let (recipe, node, stop) = (
                recipe.clone(),
                fleet.nodes[index].clone(),
                fleet.stops[index].clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let joining = recipe.start(index, &node, Duration::ZERO, true, stop).await;
                // Ready as the service turns ready: once the join is over.
                joining.done().await;
                node.ready.store(true, Ordering::Relaxed);
            });
        }
        fleet
    }

    fn empty(n: usize) -> Fleet {
        Fleet {
            nodes: (0..n).map(|_| Arc::default()).collect(),
            // Cancelled only for a replica that leaves: a run ends by dropping its runtime,
            // and a final flush after the last window would measure nothing.
            stops: (0..n).map(|_| CancellationToken::new()).collect(),
            request: request(),
        }
    }

    /// Node `node` answers one hit: whether it is admitted.
    ///
    /// # Panics
    /// When the node has not started.
    pub fn hit(&self, node: usize) -> bool {
        self.limiter(node)
            .should_rate_limit(&self.request)
            .is_ok_and(|r| r.overall_code == Code::Ok as i32)
    }

    /// Whether node `node` reports ready (a load balancer sends it traffic).
    pub fn ready(&self, node: usize) -> bool {
        self.nodes[node].ready.load(Ordering::Relaxed)
    }

    /// Node `node`'s limiter.
    ///
    /// # Panics
    /// When the node has not started.
    pub fn limiter(&self, node: usize) -> &Arc<RateLimiter> {
        &self.started(node).limiter
    }

    /// Node `node`'s quota service, on its limiter and handed to its global mode.
    ///
    /// # Panics
    /// When the node has not started, or the fleet serves no quotas
    /// ([`Fleet::start_serving_quotas`]).
    pub fn quotas(&self, node: usize) -> &Arc<Quotas> {
        (self.started(node).quotas.as_ref()).expect("a fleet serving quotas")
    }

    fn started(&self, node: usize) -> &Started {
        self.nodes[node].started.get().expect("a replica started")
    }

    /// Node `node` stops cleanly: its sync task flushes and removes its heartbeat.
    pub fn stop(&self, node: usize) {
        self.stops[node].cancel();
    }

    /// The limit the replicas' rules put on the simulated entity.
    fn limit_in_force(&self) -> Option<Limit> {
        let rules = self.nodes.first()?.started.get()?.limiter.rules();
        Some(rules.rules.rules().first()?.limits.first()?.limit)
    }
}
