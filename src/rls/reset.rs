//! An operator's reset of counters (`POST /reset`, `sluice reset`): the descriptors of a
//! request, resolved as a decision resolves them, have every limit's counters cleared — in
//! the store first (global mode: `global/exact/reset.rs` says how, so that no replica's
//! statement brings them back), then in this replica's memory. The other replicas learn it
//! from the store: from its reset log, which their heartbeat reads each tick whether or not
//! they get requests for the entity (`global/sync/reset_log.rs`), then at their next sync of
//! it; for an exact rule, at their next request once their memory of its key being over
//! lapses (a tick at most, `OverCache`).
//!
//! In global mode a replica forgets the fleet's count it last read but keeps its own hits
//! and refunds so far: each sync states them whole and the store keeps the larger, so a
//! smaller statement would be ignored. Its hits not yet sent reach the store after the
//! reset and count there too: at most a tick of each replica's hits made before the reset.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde::Serialize;

use super::resolve::Target;
use super::{validate, RateLimiter, RequestError};
use crate::core::clock::UnixMillis;
use crate::core::window::window_count;
use crate::core::{Algorithm, Limit};
use crate::global::{ResetItem, ResetKind, StoreError};
use crate::rules::LimitSpec;

/// Why a reset failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// The request is malformed (400).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The store could not be reset (503); this replica's memory was left alone.
    #[error("the store could not be reset: {0}")]
    Store(#[from] StoreError),
    /// Global mode without a store to reset through (503).
    #[error("global mode has no store to reset through")]
    NoStore,
}

/// What a reset cleared, per descriptor in order.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Cleared {
    /// The request's domain.
    pub domain: String,
    /// One per descriptor.
    pub descriptors: Vec<ClearedDescriptor>,
}

/// One descriptor's rule and its limits' counts before the reset.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClearedDescriptor {
    /// The rule's path (`domain.key_value.key2`); `None` when no rule matched (nothing
    /// cleared).
    pub rule: Option<String>,
    /// `exact: true`: its Redis keys were deleted.
    pub exact: bool,
    /// Each limit of the rule (none when unlimited).
    pub limits: Vec<ClearedLimit>,
}

/// One limit and its count before the reset.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClearedLimit {
    /// Requests (a bucket: tokens) per unit.
    pub requests_per_unit: u32,
    /// The unit (`SECOND`, `MINUTE`, ...).
    pub unit: &'static str,
    /// The window, in seconds.
    pub window_seconds: u64,
    /// `sliding_window`, `fixed_window`, `token_bucket` or `concurrency`.
    pub algorithm: &'static str,
    /// The window's count before the reset: the store's in global mode (this replica's
    /// estimate when the store holds none or for a token bucket: tokens in use).
    pub count_before: u64,
}

fn algorithm_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::SlidingWindow => "sliding_window",
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::TokenBucket { .. } => "token_bucket",
        Algorithm::Concurrency => "concurrency",
    }
}

/// The store items of one limit, as `kind` decides.
fn item(
    entity: u128,
    j: usize,
    limit: &Limit,
    exact: bool,
    per_second: bool,
    now: UnixMillis,
) -> ResetItem {
    let epoch = now.0 / limit.window_ms;
    let epochs = [epoch, epoch.saturating_sub(1)];
    let bucket = matches!(limit.algorithm, Algorithm::TokenBucket { .. });
    let kind = match (exact, bucket) {
        (true, true) => ResetKind::ExactBucket,
        (true, false) => ResetKind::ExactWindow { epochs },
        (false, true) => ResetKind::Bucket,
        (false, false) => ResetKind::Window { epochs },
    };
    ResetItem {
        entity,
        limit: j.min(255) as u8,
        kind,
        per_second,
    }
}

// === impl RateLimiter ===

impl RateLimiter {
    /// Clears the counters of every descriptor of `req` (see the module docs) and returns
    /// what was cleared. Hits, overrides' limits and `replaces` resolve as in a decision.
    ///
    /// # Errors
    /// A malformed request; in global mode, a store that could not be reset (then nothing
    /// is cleared in memory either, and a retry is safe: a reset of a reset count is one).
    pub async fn reset(&self, req: &RateLimitRequest) -> Result<Cleared, ResetError> {
        validate::validate(&self.opts, req)?;
        let now = self.clock.now();
        let compiled = self.rules.load_full();
        let targets = self.resolve_all(&compiled, req);
        let global = self.sync.is_some();
        // (entity, rule, exact, item index of its first limit)
        let mut items = Vec::new();
        let mut starts = Vec::with_capacity(targets.len());
        for t in &targets {
            starts.push(items.len());
            let (rule, entity, exact) = match t {
                Target::NoRule => continue,
                Target::Rule(r, e, ..) => (*r, *e, r.exact && self.exact.is_some()),
                Target::Override(r, e, _) => (r, *e, false),
            };
            if rule.unlimited || !global {
                continue;
            }
            for (j, spec) in rule.limits.iter().enumerate() {
                items.push(item(entity, j, &spec.limit, exact, rule.per_second(), now));
            }
        }
        let before = if items.is_empty() {
            Vec::new()
        } else {
            let client = self.exact.as_ref().ok_or(ResetError::NoStore)?;
            client.reset(&items).await?
        };
        let mut out = Vec::with_capacity(targets.len());
        for (t, start) in targets.iter().zip(starts) {
            let Some(rule) = t.rule() else {
                out.push(ClearedDescriptor {
                    rule: None,
                    exact: false,
                    limits: Vec::new(),
                });
                continue;
            };
            let entity = match t {
                Target::Rule(_, e, ..) | Target::Override(_, e, _) => *e,
                Target::NoRule => continue,
            };
            let exact = matches!(t, Target::Rule(..)) && rule.exact && self.exact.is_some();
            let local = if rule.unlimited {
                Vec::new()
            } else {
                self.forget_entity(entity, &rule.limits, rule.per_second(), now)
            };
            if exact {
                for j in 0..rule.limits.len() {
                    self.over.forget(entity, j.min(255) as u8);
                }
            }
            let limits = if rule.unlimited {
                Vec::new()
            } else {
                rule.limits
                    .iter()
                    .enumerate()
                    .map(|(j, spec)| {
                        let stored = before.get(start + j).copied();
                        let bucket = matches!(spec.limit.algorithm, Algorithm::TokenBucket { .. });
                        let count_before = match stored {
                            Some([curr, prev]) if !bucket && (curr, prev) != (0, 0) => {
                                window_count(&spec.limit, now, prev, curr)
                            }
                            _ => local.get(j).copied().unwrap_or(0),
                        };
                        cleared_limit(spec, count_before)
                    })
                    .collect()
            };
            out.push(ClearedDescriptor {
                rule: Some(rule.full_key.clone()),
                exact,
                limits,
            });
        }
        Ok(Cleared {
            domain: req.domain.clone(),
            descriptors: out,
        })
    }

    /// Forgets the entity's counts in memory (in global mode, the fleet's as last read; it is
    /// queued so its next sync reads the store's). Returns each limit's estimate before.
    fn forget_entity(
        &self,
        entity: u128,
        limits: &[LimitSpec],
        per_second: bool,
        now: UnixMillis,
    ) -> Vec<u64> {
        let keep_unsent = self.sync.is_some();
        self.entities
            .get(entity, |e| {
                let mut before = Vec::with_capacity(limits.len());
                for (st, spec) in e.state.states.iter_mut().zip(limits) {
                    let cap = f64::from(spec.limit.capacity());
                    before.push((st.pressure(&spec.limit, now) * cap).round().max(0.0) as u64);
                    st.forget(keep_unsent);
                }
                if let Some(q) = &self.sync {
                    q.mark_dirty(entity, e.state, per_second);
                }
                before
            })
            .unwrap_or_default()
    }
}

fn cleared_limit(spec: &LimitSpec, count_before: u64) -> ClearedLimit {
    ClearedLimit {
        requests_per_unit: spec.limit.requests_per_unit,
        unit: spec.unit.name(),
        window_seconds: spec.limit.window_ms / 1000,
        algorithm: algorithm_name(spec.limit.algorithm),
        count_before,
    }
}
