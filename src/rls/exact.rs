//! Exact rules in global mode (README, "Exact rules"): a request's exact descriptors become
//! [`ExactItem`]s, decided by one atomic store call per shard, all or none counted; keys
//! known to be over are answered from memory until their window moves; and when the store
//! fails, the descriptor is decided from memory like a normal rule's, on the prior every
//! cold entity gets (`core/prior.rs`: `1.05 × limit / live replicas`), and counted so.
//!
//! Pure but for the store call, which `mod.rs` awaits between the two halves here
//! ([`RateLimiter::exact_plan`] before, [`RateLimiter::exact_answers`] after).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use opentelemetry::KeyValue;
use parking_lot::Mutex;

use super::evaluate::{pick, Outcome};
use super::resolve::Target;
use super::RateLimiter;
use crate::core::clock::UnixMillis;
use crate::core::window::{verdict_on, window_count};
use crate::core::{Algorithm, Limit, Verdict};
use crate::global::exact::{ExactCount, ExactReply, ExactStats};
use crate::global::{ExactItem, StoreError};
use crate::telemetry::Telemetry;

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
    owners: Vec<usize>,
    /// Count when all fit (false when another descriptor is over and
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` holds the others back).
    pub(super) commit: bool,
}

/// Counts read from the store for a key that was over, valid in their epoch.
#[derive(Debug, Clone, Copy)]
struct Seen {
    epoch: u64,
    prev: u64,
    curr: u64,
    /// The epoch's end (Unix ms): past it the entry is stale.
    until: u64,
}

/// Keys known to be over, by (entity, limit index): bounded, dropped when their epoch ends.
#[derive(Debug, Default)]
pub(super) struct OverCache(Mutex<HashMap<(u128, u8), Seen>>);

impl OverCache {
    fn get(&self, it: &ExactItem) -> Option<Seen> {
        let map = self.0.lock();
        map.get(&(it.entity, it.limit))
            .copied()
            .filter(|s| s.epoch == it.epoch)
    }

    fn remember(&self, it: &ExactItem, c: &ExactCount, now: UnixMillis) {
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
        let seen = Seen {
            epoch: it.epoch,
            prev: c.prev,
            curr: c.curr,
            until: (it.epoch + 1) * it.window_ms,
        };
        map.insert((it.entity, it.limit), seen);
    }

    /// Entries held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

fn limit_of(it: &ExactItem) -> Limit {
    Limit {
        requests_per_unit: it.requests_per_unit,
        window_ms: it.window_ms,
        algorithm: if it.sliding {
            Algorithm::SlidingWindow
        } else {
            Algorithm::FixedWindow
        },
    }
}

/// The verdict of an item on counts `prev`/`curr`, over when `over` says so.
fn verdict(it: &ExactItem, now: UnixMillis, prev: u64, curr: u64, over: bool) -> Verdict {
    let limit = limit_of(it);
    let hits = if it.refund { 0 } else { it.hits };
    let mut v = verdict_on(&limit, now, window_count(&limit, now, prev, curr), hits);
    v.over = over;
    v.retry_ms = if over { v.reset_ms } else { 0 };
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
            let Target::Rule(rule, entity, _) = t else {
                continue;
            };
            if !rule.exact || rule.unlimited {
                continue;
            }
            for (j, spec) in rule.limits.iter().enumerate() {
                let w = spec.limit.window_ms;
                plan.items.push(ExactItem {
                    entity: *entity,
                    limit: j.min(255) as u8,
                    epoch: now.0 / w,
                    window_ms: w,
                    left_ms: w - now.0 % w,
                    sliding: spec.limit.algorithm == Algorithm::SlidingWindow,
                    requests_per_unit: spec.limit.requests_per_unit,
                    hits: hits[i].min(1 << 32),
                    ttl_ms: 2 * w,
                    refund: refund(i),
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
        let seen: Vec<Option<Seen>> = plan.items.iter().map(|it| self.over.get(it)).collect();
        let verdicts: Vec<Verdict> = plan
            .items
            .iter()
            .zip(&seen)
            .map(|(it, s)| {
                let (prev, curr) = s.map_or((0, 0), |s| (s.prev, s.curr));
                let limit = limit_of(it);
                let count = window_count(&limit, now, prev, curr);
                let over = s.is_some() && verdict_on(&limit, now, count, it.hits).over;
                verdict(it, now, prev, curr, over)
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
                let verdicts: Vec<Verdict> = plan
                    .items
                    .iter()
                    .zip(&r.counts)
                    .map(|(it, c)| {
                        self.over.remember(it, c, now);
                        verdict(it, now, c.prev, c.curr, c.over)
                    })
                    .collect();
                self.gather(plan, &verdicts)
            }
            Err(e) => {
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
        self.exact.get().map(|c| &*c.stats)
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
            let replicas = self.sync.as_ref().map_or(1, |q| q.live_replicas());
            tracing::warn!(error = %e, replicas, "exact rules: Redis failed; deciding from memory on this replica's share of the limit (1.05 × limit / live replicas)");
        }
    }
}

/// Registers the exact path's metrics.
pub(super) fn register_metrics(t: &Telemetry, stats: &std::sync::Arc<ExactStats>) {
    let counters: [crate::telemetry::CounterRow<ExactStats>; 3] = [
        (
            "sluice_exact_fallback_total",
            "Exact descriptors decided from memory on the prior (1.05 × limit / live replicas) because Redis failed",
            |s| s.fallbacks.load(Ordering::Relaxed),
        ),
        (
            "sluice_exact_from_memory_total",
            "Exact requests answered from memory: a key known to be over in its window",
            |s| s.from_memory.load(Ordering::Relaxed),
        ),
        (
            "sluice_exact_given_back_total",
            "Exact calls that gave their hits back (another shard refused or failed)",
            |s| s.given_back.load(Ordering::Relaxed),
        ),
    ];
    t.counter_table(stats, &counters);
    let s = stats.clone();
    t.counter(
        "sluice_exact_calls_total",
        "Exact rules' Redis calls, by result",
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
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::{
        rate_limit_response::Code, RateLimitRequest,
    };

    use super::*;
    use crate::core::clock::ManualClock;
    use crate::global::memory::MemoryStore;
    use crate::global::{ExactClient, ShardRouter, SyncQueues};
    use crate::rls::Options;

    /// The start of a minute.
    const T0: UnixMillis = UnixMillis(1_700_006_400_000);

    const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window, exact: true}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, exact: true}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 10, exact: true}\n";

    struct Fixture {
        limiter: Arc<RateLimiter>,
        store: Arc<MemoryStore>,
        queues: Arc<SyncQueues>,
        clock: ManualClock,
    }

    fn fixture() -> Fixture {
        let rules =
            crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
        let names = vec!["memory".to_string()];
        let queues = Arc::new(SyncQueues::new(ShardRouter::new(&names), 1, 10_000));
        let clock = ManualClock::new(T0);
        let telemetry = Arc::new(crate::telemetry::Telemetry::new().unwrap());
        let limiter = RateLimiter::new(
            rules,
            vec![],
            Arc::new(clock.clone()),
            Options::default(),
            telemetry,
            Some(queues.clone()),
        );
        let store = Arc::new(MemoryStore::default());
        let client = ExactClient::new(
            vec![store.clone()],
            ShardRouter::new(&names),
            Duration::from_millis(100),
        );
        limiter.set_exact(client);
        Fixture {
            limiter,
            store,
            queues,
            clock,
        }
    }

    fn req(keys: &[&str]) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors: keys
                .iter()
                .map(|k| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: (*k).into(),
                        value: "u1".into(),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// Each descriptor's code and remaining.
    async fn ask(f: &Fixture, keys: &[&str]) -> Vec<(i32, u32)> {
        let r = f.limiter.should_rate_limit_async(&req(keys)).await.unwrap();
        r.statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect()
    }

    /// The store's exact counts, summed per epoch-independent key (one entity per rule here).
    fn stored(f: &Fixture) -> Vec<u64> {
        let mut v: Vec<u64> = f.store.exact.lock().values().copied().collect();
        v.sort_unstable();
        v
    }

    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;

    #[tokio::test]
    async fn a_request_counts_all_its_exact_descriptors_or_none() {
        let f = fixture();
        assert_eq!(ask(&f, &["a", "b"]).await, vec![(OK, 1), (OK, 4)]);
        assert_eq!(ask(&f, &["a", "b"]).await, vec![(OK, 0), (OK, 3)]);
        // `a` is full: `b` fits but is not counted either, and the request is over.
        assert_eq!(ask(&f, &["a", "b"]).await, vec![(OVER, 0), (OK, 2)]);
        assert_eq!(stored(&f), vec![2, 2]);
        // Alone, `b` is counted.
        assert_eq!(ask(&f, &["b"]).await, vec![(OK, 2)]);
        assert_eq!(stored(&f), vec![2, 3]);
        // Nothing reached the local counters or the background sync.
        assert!(f.queues.is_empty());
    }

    #[tokio::test]
    async fn a_key_known_to_be_over_is_answered_from_memory_until_its_window_moves() {
        let f = fixture();
        for _ in 0..2 {
            assert_eq!(ask(&f, &["a"]).await[0].0, OK);
        }
        assert_eq!(ask(&f, &["a"]).await[0].0, OVER);
        let calls = f.store.exact_calls.load(Ordering::Relaxed);
        assert_eq!(calls, 3);
        assert_eq!(f.limiter.over.len(), 1);
        // Over again, with no store call, until the minute ends; `c` alone still calls.
        f.clock.advance_ms(59_999);
        for _ in 0..5 {
            assert_eq!(ask(&f, &["a", "c"]).await, vec![(OVER, 0), (OK, 9)]);
        }
        assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls);
        assert_eq!(stored(&f), vec![2]);
        let stats = f.limiter.exact.get().unwrap().stats.clone();
        assert_eq!(stats.from_memory.load(Ordering::Relaxed), 5);
        // The next window: asked again, and admitted.
        f.clock.advance_ms(1);
        assert_eq!(ask(&f, &["a"]).await, vec![(OK, 1)]);
        assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), calls + 1);
    }

    #[tokio::test]
    async fn with_the_store_down_the_prior_decides_on_this_replicas_share() {
        let f = fixture();
        f.queues.set_live_replicas(4);
        f.store.down.store(true, Ordering::Relaxed);
        // `c` allows 10 a minute: this replica's share of 4 is 1.05 × 10 / 4, 2 whole hits.
        // The statuses report the rule's own limit, as every decision from memory does.
        assert_eq!(ask(&f, &["c"]).await, vec![(OK, 9)]);
        assert_eq!(ask(&f, &["c"]).await, vec![(OK, 8)]);
        assert_eq!(ask(&f, &["c"]).await, vec![(OVER, 0)]);
        let stats = f.limiter.exact.get().unwrap().stats.clone();
        assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 3);
        let metrics = f.limiter.telemetry().render();
        assert!(
            metrics.contains("sluice_exact_fallback_total 3"),
            "{metrics}"
        );
        // Counted like a normal rule's hits: queued for the background sync.
        assert_eq!(f.queues.len(), 1);
        // Redis back: the exact counters decide again (they never saw the prior's hits).
        f.store.down.store(false, Ordering::Relaxed);
        assert_eq!(ask(&f, &["c"]).await, vec![(OK, 9)]);
    }

    #[tokio::test]
    async fn a_shard_failing_gives_back_what_the_other_counted_and_the_prior_decides() {
        let f = fixture();
        let names = vec!["m0".to_string(), "m1".to_string()];
        let router = ShardRouter::new(&names);
        let rules =
            crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
        let shard = |k: &str| router.shard(rules.find("d", &[(k, "u1")]).unwrap().entity);
        let (up, down) = (shard("b"), 1 - shard("b"));
        let other = ["a", "c"].into_iter().find(|k| shard(k) == down).unwrap();
        let stores = [
            Arc::new(MemoryStore::default()),
            Arc::new(MemoryStore::default()),
        ];
        stores[down].down.store(true, Ordering::Relaxed);
        let client = ExactClient::new(
            stores.iter().map(|s| s.clone() as _).collect(),
            router,
            Duration::from_millis(100),
        );
        let limiter = RateLimiter::new(
            rules,
            vec![],
            Arc::new(f.clock.clone()),
            Options::default(),
            Arc::new(crate::telemetry::Telemetry::new().unwrap()),
            Some(f.queues.clone()),
        );
        limiter.set_exact(client);
        let r = limiter
            .should_rate_limit_async(&req(&["b", other]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, OK, "the prior admits");
        // `b`'s shard counted, then gave it back: the store holds nothing for it.
        let held: u64 = stores[up].exact.lock().values().sum();
        assert_eq!(held, 0);
        let stats = limiter.exact.get().unwrap().stats.clone();
        assert_eq!(stats.given_back.load(Ordering::Relaxed), 1);
        assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn without_exact_descriptors_nothing_is_asked() {
        let f = fixture();
        let r = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "unknown".into(),
                    value: "x".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        f.limiter.should_rate_limit_async(&r).await.unwrap();
        assert_eq!(f.store.exact_calls.load(Ordering::Relaxed), 0);
    }
}
