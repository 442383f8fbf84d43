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
//! ([`RateLimiter::exact_plan`] before, [`RateLimiter::exact_answers`] after).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use opentelemetry::KeyValue;
use parking_lot::Mutex;

use super::resolve::Target;
use super::RateLimiter;
use crate::core::bucket::verdict_owed;
use crate::core::clock::UnixMillis;
use crate::core::decide::{pick, Outcome};
use crate::core::limit::verdict_on;
use crate::core::window::{window_count, Prev};
use crate::core::FleetView;
use crate::core::{Algorithm, Verdict};
use crate::global::exact::bucket::refunded;
use crate::global::exact::{given_back, ExactBucket, ExactCount, ExactReply, ExactStats};
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

/// The item's own verdict on what the store held (`c`): the window's formula, or the
/// bucket's (`core/bucket/`, as local mode reports it: remaining whole tokens, reset until
/// full, retry until the request would fit). A refund is reported with 0 hits on what it
/// leaves, as `core::decide` reports one.
pub(super) fn natural(it: &ExactItem, now: UnixMillis, c: &ExactCount) -> Verdict {
    let limit = it.limit();
    let (hits, c) = if it.refund {
        let [prev, curr] = given_back(it, c);
        let left = ExactCount {
            prev: c.prev - prev,
            curr: c.curr - curr,
            owed_ns: it.bucket.map_or(0, |_| refunded(it, c.owed_ns)),
            ..*c
        };
        (0, left)
    } else {
        (it.hits, *c)
    };
    let c = &c;
    if it.bucket.is_some() {
        return verdict_owed(&limit, now, c.owed_ns, hits);
    }
    let mut v = verdict_on(&limit, now, window_count(&limit, now, c.prev, c.curr), hits);
    v.retry_ms = if v.over { v.reset_ms } else { 0 };
    v
}

/// The verdict of an item on what the store held (`c`), over when `over` says so (an item
/// that fits is reported on its counts with these hits, counted or not).
fn verdict(it: &ExactItem, now: UnixMillis, c: &ExactCount, over: bool) -> Verdict {
    let mut v = natural(it, now, c);
    if over != v.over {
        v.over = over;
        v.retry_ms = if over { v.reset_ms.max(1) } else { 0 };
    }
    if over {
        v.remaining = 0;
    }
    v
}

// === impl RateLimiter ===

impl RateLimiter {
    /// The exact items of a request, `None` when no descriptor has an exact rule.
    pub(super) fn exact_plan(
        &self,
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
    pub(super) fn exact_from_memory(
        &self,
        plan: &ExactPlan,
        now: UnixMillis,
    ) -> Option<Vec<Option<ExactAnswer>>> {
        if plan.items.iter().any(|it| it.refund) {
            return None;
        }
        let seen: Vec<Option<Seen>> = plan.items.iter().map(|it| self.over.get(it, now)).collect();
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
        self.exact_stats()?
            .from_memory
            .fetch_add(1, Ordering::Relaxed);
        Some(self.gather(plan, &verdicts))
    }

    /// The answers from the store's reply; on an error the prior for every exact descriptor.
    pub(super) fn exact_answers(
        &self,
        plan: &ExactPlan,
        reply: Result<ExactReply, StoreError>,
        now: UnixMillis,
    ) -> Vec<Option<ExactAnswer>> {
        match reply {
            Ok(r) => {
                let tick_ms = self
                    .fleet
                    .as_ref()
                    .map_or(FleetView::ALONE.tick_ms, |f| f.view().tick_ms);
                let verdicts: Vec<Verdict> = plan
                    .items
                    .iter()
                    .zip(&r.counts)
                    .map(|(it, c)| {
                        self.over.remember(it, c, now, tick_ms);
                        verdict(it, now, c, c.over)
                    })
                    .collect();
                self.gather(plan, &verdicts)
            }
            Err(e) => {
                self.telemetry
                    .service
                    .redis_errors
                    .fetch_add(1, Ordering::Relaxed);
                let mut answers: Vec<Option<ExactAnswer>> = Vec::new();
                for &i in &plan.owners {
                    answers.resize_with(answers.len().max(i + 1), || None);
                    answers[i] = Some(ExactAnswer::Prior);
                }
                let n = answers.iter().flatten().count() as u64;
                self.exact_fell_back(n, &e, now);
                answers
            }
        }
    }

    /// One outcome per exact descriptor: the most restrictive of its items' verdicts.
    fn gather(&self, plan: &ExactPlan, verdicts: &[Verdict]) -> Vec<Option<ExactAnswer>> {
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

    fn exact_stats(&self) -> Option<&ExactStats> {
        self.exact.as_ref().map(|c| &*c.stats)
    }

    /// Counts `n` descriptors decided by the prior, and logs it at most every 10 s.
    fn exact_fell_back(&self, n: u64, e: &StoreError, now: UnixMillis) {
        let Some(stats) = self.exact_stats() else {
            return;
        };
        stats.fallbacks.fetch_add(n, Ordering::Relaxed);
        let last = stats.last_log_ms.load(Ordering::Relaxed);
        if now.0 >= last + LOG_EVERY_MS
            && stats
                .last_log_ms
                .compare_exchange(last, now.0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let replicas = self.fleet.as_ref().map_or(1, |f| f.live_replicas());
            tracing::warn!(error = %e, replicas, "exact rules: Redis failed; deciding from memory on this replica's share of the limit (1.05 × limit / live replicas)");
        }
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
