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
//!
//! [`RateLimiter::reset`](super::RateLimiter::reset) validates and resolves the request, and
//! hands [`reset`] the targets and what it uses ([`Resetting`]: the table, and global mode's
//! queues, exact client and memory of exact keys over).

use serde::Serialize;

use super::exact::OverCache;
use super::resolve::Target;
use super::RequestError;
use crate::core::clock::UnixMillis;
use crate::core::table::EntityTable;
use crate::core::window::window_count;
use crate::core::{Algorithm, Limit};
use crate::global::{ExactClient, ResetItem, ResetKind, StoreError, SyncQueues};
use crate::rules::{LimitSpec, Rule};

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

/// What a reset is handed: the table the counts live in, and in global mode the queues
/// (a forgotten entity is queued to read the store's count), the exact rules' client (the
/// store's reset goes through it) and the memory of exact keys over.
pub(super) struct Resetting<'a> {
    pub table: &'a EntityTable,
    pub queues: Option<&'a SyncQueues>,
    pub exact: Option<&'a ExactClient>,
    pub over: &'a OverCache,
}

/// Clears the counters of every target of a request for `domain` (see the module docs) at
/// `now`, and returns what was cleared.
pub(super) async fn reset(
    at: &Resetting<'_>,
    domain: &str,
    targets: &[Target<'_>],
    now: UnixMillis,
) -> Result<Cleared, ResetError> {
    let (items, starts) = store_items(at, targets, now);
    let before = if items.is_empty() {
        Vec::new()
    } else {
        let client = at.exact.ok_or(ResetError::NoStore)?;
        client.reset(&items).await?
    };
    let descriptors = (targets.iter().zip(starts))
        .map(|(t, start)| cleared(at, t, &before[start.min(before.len())..], now))
        .collect();
    Ok(Cleared {
        domain: domain.to_string(),
        descriptors,
    })
}

/// In global mode, the store items of every limit of the targets (none in local mode), and
/// where each target's first limit's item is.
fn store_items(
    at: &Resetting<'_>,
    targets: &[Target<'_>],
    now: UnixMillis,
) -> (Vec<ResetItem>, Vec<usize>) {
    let global = at.queues.is_some();
    let mut items = Vec::new();
    let mut starts = Vec::with_capacity(targets.len());
    for t in targets {
        starts.push(items.len());
        let (rule, entity, exact) = match t {
            Target::NoRule => continue,
            Target::Rule(r, e, ..) => (*r, *e, r.exact && at.exact.is_some()),
            Target::Override(r, e, _) => (r, *e, false),
        };
        if rule.unlimited || !global {
            continue;
        }
        for (j, spec) in rule.limits.iter().enumerate() {
            items.push(item(entity, j, &spec.limit, exact, rule.per_second(), now));
        }
    }
    (items, starts)
}

/// One target cleared in memory (its exact keys forgotten as over), and its limits' counts
/// before: the store's (`stored`, from the target's first limit on) when it held any, this
/// replica's estimate otherwise.
fn cleared(
    at: &Resetting<'_>,
    t: &Target<'_>,
    stored: &[[u64; 2]],
    now: UnixMillis,
) -> ClearedDescriptor {
    let (rule, entity): (&Rule, u128) = match t {
        Target::NoRule => {
            return ClearedDescriptor {
                rule: None,
                exact: false,
                limits: Vec::new(),
            }
        }
        Target::Rule(r, e, ..) => (r, *e),
        Target::Override(r, e, _) => (r, *e),
    };
    let exact = matches!(t, Target::Rule(..)) && rule.exact && at.exact.is_some();
    let local = if rule.unlimited {
        Vec::new()
    } else {
        forget_entity(at, entity, &rule.limits, rule.per_second(), now)
    };
    if exact {
        for j in 0..rule.limits.len() {
            at.over.forget(entity, j.min(255) as u8);
        }
    }
    let limits = if rule.unlimited {
        Vec::new()
    } else {
        (rule.limits.iter().enumerate())
            .map(|(j, spec)| {
                let bucket = matches!(spec.limit.algorithm, Algorithm::TokenBucket { .. });
                let count_before = match stored.get(j).copied() {
                    Some([curr, prev]) if !bucket && (curr, prev) != (0, 0) => {
                        window_count(&spec.limit, now, prev, curr)
                    }
                    _ => local.get(j).copied().unwrap_or(0),
                };
                cleared_limit(spec, count_before)
            })
            .collect()
    };
    ClearedDescriptor {
        rule: Some(rule.full_key.clone()),
        exact,
        limits,
    }
}

/// Forgets the entity's counts in memory (in global mode, the fleet's as last read; it is
/// queued so its next sync reads the store's). Returns each limit's estimate before.
fn forget_entity(
    at: &Resetting<'_>,
    entity: u128,
    limits: &[LimitSpec],
    per_second: bool,
    now: UnixMillis,
) -> Vec<u64> {
    let keep_unsent = at.queues.is_some();
    at.table
        .get(entity, |e| {
            let mut before = Vec::with_capacity(limits.len());
            for (st, spec) in e.state.states.iter_mut().zip(limits) {
                let cap = f64::from(spec.limit.capacity());
                before.push((st.pressure(&spec.limit, now) * cap).round().max(0.0) as u64);
                st.forget(keep_unsent);
            }
            if let Some(q) = at.queues {
                q.mark_dirty(entity, e.state, per_second);
            }
            before
        })
        .unwrap_or_default()
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
