//! Exact rules in global mode (docs/global.md, "Exact rules"): a request's exact descriptors become
//! [`ExactItem`]s (one per limit: windows and token buckets alike), decided by one atomic
//! store call per shard, all or none counted; keys known to be over are answered from memory
//! until their window moves (a bucket: until the `tat` read says the request fits), for a sync
//! tick at most, so a refund made through another replica is seen within a tick (a refund
//! through this one clears the key at once); and when
//! the store fails, the descriptor is decided from memory like a normal rule's, on the prior
//! every cold entity gets (`core/window/prior.rs`: `1.05 × limit / live replicas`, a bucket's own
//! bucket of `1.05 × burst / live replicas`), and counted so.
//!
//! Pure but for the store call, which `mod.rs` awaits between the two halves here
//! ([`plan`] before, [`answers`] after): functions handed the plan and what they use
//! ([`ExactWay`]), not methods of the limiter. An item's
//! verdict on the store's counts is the core's (`core/exact.rs`, beside `decide`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use parking_lot::Mutex;

use super::resolve::Target;
use crate::core::clock::UnixMillis;
use crate::core::decide::{pick, Outcome};
use crate::core::exact::{self, ExactAsk, StoreCounts};
use crate::core::window::Prev;
use crate::core::FleetView;
use crate::core::{Algorithm, Verdict};
use crate::global::exact::{ExactBucket, ExactCount, ExactReply, ExactStats};
use crate::global::{ExactItem, StoreError};
use crate::telemetry::{names, Telemetry};

/// Keys remembered as over, at most.
const OVER_CACHE_MAX: usize = 4096;

/// At most one fallback log line per this many milliseconds.
const LOG_EVERY_MS: u64 = 10_000;

/// How a descriptor's exact decision was made.
pub(super) enum ExactAnswer {
    /// From the store's counts, or from memory for a key known to be over.
    Decided(Outcome),
    /// The store failed: the prior decides.
    Prior,
}

/// A request's exact items: per item, the descriptor it belongs to.
pub(super) struct ExactPlan {
    pub(super) items: Vec<ExactItem>,
    pub(super) owners: Vec<usize>,
    /// Count when all fit (false when another descriptor is over and
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` holds the others back).
    pub(super) commit: bool,
}

/// Counts read from the store for a key that was over, valid in their epoch; for a bucket,
/// its `tat` (epoch 0).
#[derive(Debug, Clone, Copy)]
struct Seen {
    epoch: u64,
    prev: u64,
    curr: u64,
    /// A bucket's `tat` as read (Unix ns): it only moves later with spends, so while it says
    /// a request would not fit, that request is over (refunds aside, as for windows).
    tat_ns: u64,
    /// The epoch's end, or when the bucket is full again, and at most a sync tick after the
    /// read (Unix ms): past it the entry is stale.
    until: u64,
}

impl Seen {
    /// What the store would have said for `it` at `now`, as far as remembered.
    fn count(&self, it: &ExactItem, now: UnixMillis) -> ExactCount {
        ExactCount {
            prev: self.prev,
            curr: self.curr,
            over: false,
            owed_ns: self.tat_ns.saturating_sub(now_ns(it, now)),
        }
    }
}

/// The request's time in Unix ns, as a bucket item carries it.
fn now_ns(it: &ExactItem, now: UnixMillis) -> u64 {
    it.bucket
        .map_or(now.0.saturating_mul(1_000_000), |b| b.now_ns())
}

/// Keys known to be over, by (entity, limit index): bounded, dropped when their epoch ends (a
/// bucket's when it is full again) or a sync tick after they were read. Other replicas' refunds
/// reach Redis, not this memory: the tick bounds how long a key they took back under its
/// limit is still refused here (envoyproxy/ratelimit's over-limit cache refused it until
/// the window ended, its PR #1230), at a Redis call per over key and tick.
#[derive(Debug, Default)]
pub(super) struct OverCache(Mutex<HashMap<(u128, u8), Seen>>);

impl OverCache {
    fn get(&self, it: &ExactItem, now: UnixMillis) -> Option<Seen> {
        let map = self.0.lock();
        map.get(&(it.entity, it.limit))
            .copied()
            .filter(|s| s.epoch == it.epoch && now.0 < s.until)
    }

    /// Remembers (or, when it fits or gives back, forgets) what the store said of `it` at
    /// `now`, for `tick_ms` at most.
    fn remember(&self, it: &ExactItem, c: &ExactCount, now: UnixMillis, tick_ms: u64) {
        let mut map = self.0.lock();
        if !c.over || it.refund {
            map.remove(&(it.entity, it.limit));
            return;
        }
        if map.len() >= OVER_CACHE_MAX {
            map.retain(|_, s| s.until > now.0);
            if map.len() >= OVER_CACHE_MAX {
                map.clear();
            }
        }
        let seen = match it.bucket {
            // A denied bucket is remembered until it is full again; a request on it is answered
            // from memory while the `tat` read says it does not fit, i.e. until its retry time.
            Some(_) => {
                let tat_ns = now_ns(it, now).saturating_add(c.owed_ns);
                Seen {
                    epoch: it.epoch,
                    prev: 0,
                    curr: 0,
                    tat_ns,
                    until: tat_ns.div_ceil(1_000_000),
                }
            }
            None => Seen {
                epoch: it.epoch,
                prev: c.prev,
                curr: c.curr,
                tat_ns: 0,
                until: (it.epoch + 1) * it.window_ms,
            },
        };
        let until = seen.until.min(now.0.saturating_add(tick_ms));
        map.insert((it.entity, it.limit), Seen { until, ..seen });
    }

    /// Forgets the key (an operator's reset): the next request asks the store.
    pub(super) fn forget(&self, entity: u128, limit: u8) {
        self.0.lock().remove(&(entity, limit));
    }

    /// Entries held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// An item as the core's exact verdict asks it (`core/exact.rs`).
fn ask(it: &ExactItem) -> ExactAsk {
    ExactAsk {
        limit: it.limit(),
        hits: it.hits,
        refund: it.refund,
    }
}

/// What the store held, as the core's exact verdict reads it.
fn held(c: &ExactCount) -> StoreCounts {
    StoreCounts {
        prev: c.prev,
        curr: c.curr,
        owed_ns: c.owed_ns,
    }
}

/// The item's own verdict on what the store held (`c`): `core::exact::natural`.
pub(super) fn natural(it: &ExactItem, now: UnixMillis, c: &ExactCount) -> Verdict {
    exact::natural(&ask(it), now, &held(c))
}

/// The item's verdict on what the store held (`c`), over when `over` says so:
/// `core::exact::verdict`.
fn verdict(it: &ExactItem, now: UnixMillis, c: &ExactCount, over: bool) -> Verdict {
    exact::verdict(&ask(it), now, &held(c), over)
}

/// What the exact path is handed, beside the plan: the keys known to be over, the exact
/// client's counters, the fleet as the heartbeats last said (the tick bounds what is
/// remembered; the live count is in the fallback's log line) and the Redis error counter.
pub(super) struct ExactWay<'a> {
    pub over: &'a OverCache,
    pub stats: &'a ExactStats,
    /// `FleetView::ALONE` in local mode.
    pub fleet: FleetView,
    pub redis_errors: &'a AtomicU64,
}

/// The exact items of a request, `None` when no descriptor has an exact rule.
pub(super) fn plan(
    targets: &[Target<'_>],
    hits: &[u64],
    refund: impl Fn(usize) -> bool,
    now: UnixMillis,
) -> Option<ExactPlan> {
    let mut plan = ExactPlan {
        items: Vec::new(),
        owners: Vec::new(),
        commit: true,
    };
    for (i, t) in targets.iter().enumerate() {
        let Target::Rule(rule, entity, ..) = t else {
            continue;
        };
        if !rule.exact || rule.unlimited {
            continue;
        }
        for (j, spec) in rule.limits.iter().enumerate() {
            let w = spec.limit.window_ms;
            let bucket = match spec.limit.algorithm {
                Algorithm::TokenBucket { burst } => Some(ExactBucket {
                    burst,
                    now_us: now.0.saturating_mul(1000),
                }),
                _ => None,
            };
            plan.items.push(ExactItem {
                entity: *entity,
                limit: j.min(255) as u8,
                // A bucket has no epochs: 0, so that a remembered one never goes stale
                // by epoch (`OverCache::get`).
                epoch: if bucket.is_some() { 0 } else { now.0 / w },
                window_ms: w,
                left_ms: w - now.0 % w,
                prev: Prev::of(spec.limit.algorithm),
                requests_per_unit: spec.limit.requests_per_unit,
                hits: hits[i].min(1 << 32),
                ttl_ms: 2 * w,
                refund: refund(i),
                bucket,
                per_second: rule.per_second(),
            });
            plan.owners.push(i);
        }
    }
    (!plan.items.is_empty()).then_some(plan)
}

/// Answers from memory when a key of the plan is known to be over (and nothing is given
/// back): all or nothing, so nothing is counted. Keys not remembered are reported on a
/// count of 0 (not read).
pub(super) fn from_memory(
    way: &ExactWay<'_>,
    plan: &ExactPlan,
    now: UnixMillis,
) -> Option<Vec<Option<ExactAnswer>>> {
    if plan.items.iter().any(|it| it.refund) {
        return None;
    }
    let seen: Vec<Option<Seen>> = plan.items.iter().map(|it| way.over.get(it, now)).collect();
    let verdicts: Vec<Verdict> = plan
        .items
        .iter()
        .zip(&seen)
        .map(|(it, s)| {
            // Keys not remembered are reported on nothing counted (a full bucket).
            let c = s.map_or(ExactCount::default(), |s| s.count(it, now));
            let over = s.is_some() && natural(it, now, &c).over;
            verdict(it, now, &c, over)
        })
        .collect();
    if !verdicts.iter().any(|v| v.over) {
        return None;
    }
    way.stats.from_memory.fetch_add(1, Ordering::Relaxed);
    Some(gather(plan, &verdicts))
}

/// The answers from the store's reply; on an error the prior for every exact descriptor.
pub(super) fn answers(
    way: &ExactWay<'_>,
    plan: &ExactPlan,
    reply: Result<ExactReply, StoreError>,
    now: UnixMillis,
) -> Vec<Option<ExactAnswer>> {
    match reply {
        Ok(r) => {
            let tick_ms = way.fleet.tick_ms;
            let verdicts: Vec<Verdict> = plan
                .items
                .iter()
                .zip(&r.counts)
                .map(|(it, c)| {
                    way.over.remember(it, c, now, tick_ms);
                    verdict(it, now, c, c.over)
                })
                .collect();
            gather(plan, &verdicts)
        }
        Err(e) => {
            way.redis_errors.fetch_add(1, Ordering::Relaxed);
            let mut answers: Vec<Option<ExactAnswer>> = Vec::new();
            for &i in &plan.owners {
                answers.resize_with(answers.len().max(i + 1), || None);
                answers[i] = Some(ExactAnswer::Prior);
            }
            let n = answers.iter().flatten().count() as u64;
            fell_back(way, n, &e, now);
            answers
        }
    }
}

/// One outcome per exact descriptor: the most restrictive of its items' verdicts.
fn gather(plan: &ExactPlan, verdicts: &[Verdict]) -> Vec<Option<ExactAnswer>> {
    let mut answers: Vec<Option<ExactAnswer>> = Vec::new();
    let mut start = 0;
    while start < plan.items.len() {
        let owner = plan.owners[start];
        let end = start
            + plan.owners[start..]
                .iter()
                .take_while(|&&o| o == owner)
                .count();
        answers.resize_with(answers.len().max(owner + 1), || None);
        answers[owner] = pick(verdicts[start..end].iter().copied()).map(ExactAnswer::Decided);
        start = end;
    }
    answers
}

/// Counts `n` descriptors decided by the prior, and logs it at most every 10 s.
fn fell_back(way: &ExactWay<'_>, n: u64, e: &StoreError, now: UnixMillis) {
    let stats = way.stats;
    stats.fallbacks.fetch_add(n, Ordering::Relaxed);
    let last = stats.last_log_ms.load(Ordering::Relaxed);
    if now.0 >= last + LOG_EVERY_MS
        && stats
            .last_log_ms
            .compare_exchange(last, now.0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let replicas = way.fleet.live;
        tracing::warn!(error = %e, replicas, "exact rules: Redis failed; deciding from memory on this replica's share of the limit (1.05 × limit / live replicas)");
    }
}

/// Registers the exact path's metrics.
pub(super) fn register_metrics(t: &Telemetry, stats: &std::sync::Arc<ExactStats>) {
    let counters: [crate::telemetry::CounterRow<ExactStats>; 3] = [
        (names::EXACT_FALLBACK, |s| {
            s.fallbacks.load(Ordering::Relaxed)
        }),
        (names::EXACT_FROM_MEMORY, |s| {
            s.from_memory.load(Ordering::Relaxed)
        }),
        (names::EXACT_GIVEN_BACK, |s| {
            s.given_back.load(Ordering::Relaxed)
        }),
    ];
    t.counter_table(stats, &counters);
    let s = stats.clone();
    t.counter(
        names::EXACT_CALLS,
        std::sync::Arc::new(move || {
            vec![
                (
                    s.calls_ok.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "ok")],
                ),
                (
                    s.calls_failed.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "error")],
                ),
            ]
        }),
    );
}

#[cfg(test)]
#[path = "exact_tests.rs"]
mod tests;
