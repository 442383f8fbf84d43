//! sluice's fleet under simulation: each replica is the production code — a
//! [`RateLimiter`] in global mode answering `ShouldRateLimit`, started by `global::spawn` as
//! the service starts it (the queues, the supervised sync task running its real loop — tick,
//! tier cadence, backoff — and the clock-offset task) against the shared [`SimStore`] — on a
//! clock read from tokio's paused time.
//!
//! Nothing of the mechanism is modelled here: this file only starts the pieces and turns a
//! scenario's limit into a rules file. The store's `TIME` moves no simulated clock (a
//! [`SimClock`] keeps no offset), so the offset task changes no number.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::SimStore;
use crate::core::clock::{Clock, UnixMillis};
use crate::core::{Algorithm, Limit, SyncPolicy};
use crate::global::{PresenceHub, Stores, SyncConfig, SyncSettings};
use crate::rls::{Options, RateLimiter};
use crate::telemetry::Telemetry;

/// A node's clock: Unix time `t0` at the instant `zero` of tokio's clock, moving with it.
/// Under paused time the decisions and the sync task read the same simulated time, and no
/// wall clock is involved. Before `zero` it reads `t0`.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    /// The Unix time at `zero`.
    pub t0: UnixMillis,
    /// The tokio instant the simulated run calls `t0`.
    pub zero: Instant,
}

impl Clock for SimClock {
    fn now(&self) -> UnixMillis {
        let elapsed = Instant::now().saturating_duration_since(self.zero);
        UnixMillis(self.t0.0 + elapsed.as_millis() as u64)
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

/// The replicas of one run, their sync tasks started.
pub struct Fleet {
    limiters: Vec<Arc<RateLimiter>>,
    /// Each replica's presence exchange, idle until the quota scenarios (`rlqs.rs`) attach
    /// their engine.
    presence: Vec<PresenceHub>,
    /// Each replica's shutdown: cancelled, its sync task makes its final flush (which
    /// removes its heartbeat), as at SIGTERM.
    stops: Vec<CancellationToken>,
    request: RateLimitRequest,
}

impl Fleet {
    /// Starts `phases.len()` replicas on `store`, each deciding on a [`SimClock`] and each
    /// sync task starting after its own phase. Must run inside the simulation's runtime.
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
        let yaml = rules_yaml(limit, strict);
        // Cancelled only for a replica that leaves: a run ends by dropping its runtime, and a
        // final flush after the last window would measure nothing.
        let stops: Vec<CancellationToken> =
            phases.iter().map(|_| CancellationToken::new()).collect();
        let settings = SyncSettings {
            policy: SyncPolicy {
                tick_ms,
                ..SyncPolicy::default()
            },
            ..SyncSettings::default()
        };
        let mut limiters = Vec::with_capacity(phases.len());
        let mut presence = Vec::with_capacity(phases.len());
        for (node, (&phase, stop)) in phases.iter().zip(&stops).enumerate() {
            let rules = crate::rules::compile_sources(&[("sim.yaml".into(), yaml.clone())], false)
                .unwrap_or_else(|e| panic!("simulated rules: {e:?}"));
            let telemetry = Arc::new(Telemetry::new().expect("a metrics pipeline"));
            // One shard, started as the service starts global mode; the node's sync waits for
            // its phase.
            let config = SyncConfig {
                // Distinct and the same on every run, where production draws one at random.
                replica_id: Some(node as u64 + 1),
                first_run_after: Duration::from_millis(phase),
                ..SyncConfig::new(settings, 1_000_000) // SYNC_MAX_QUEUED's default
            };
            let global = crate::global::spawn(
                config,
                Stores::one(store.clone()),
                Arc::new(clock),
                &telemetry,
                stop.clone(),
            )
            .await;
            presence.push(global.presence.clone());
            limiters.push(RateLimiter::new(
                rules,
                vec![],
                Arc::new(clock),
                Options::default(),
                telemetry,
                Some(global.queues.into()),
            ));
        }
        let fleet = Fleet {
            limiters,
            presence,
            stops,
            request: request(),
        };
        debug_assert_eq!(fleet.limit_in_force(), Some(*limit));
        fleet
    }

    /// Node `node` answers one hit: whether it is admitted.
    pub fn hit(&self, node: usize) -> bool {
        self.limiters[node]
            .should_rate_limit(&self.request)
            .is_ok_and(|r| r.overall_code == Code::Ok as i32)
    }

    /// Node `node`'s limiter: the quota scenarios (`rlqs.rs`) serve Envoy streams on it.
    pub fn limiter(&self, node: usize) -> &Arc<RateLimiter> {
        &self.limiters[node]
    }

    /// Node `node`'s presence exchange (`global/presence/`).
    pub fn presence(&self, node: usize) -> &PresenceHub {
        &self.presence[node]
    }

    /// Node `node` stops cleanly: its sync task flushes and removes its heartbeat.
    pub fn stop(&self, node: usize) {
        self.stops[node].cancel();
    }

    /// The limit the replicas' rules put on the simulated entity.
    fn limit_in_force(&self) -> Option<Limit> {
        let rules = self.limiters.first()?.rules();
        Some(rules.rules.rules().first()?.limits.first()?.limit)
    }
}
