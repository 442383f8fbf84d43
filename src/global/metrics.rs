//! Global mode's metrics: the sync's counters (ticks, items, Redis calls, failures), the
//! queue's gauges and each shard's health (and how often it lost the sync's keys), read from
//! [`SyncStats`] and [`ShardHealth`] at each collection; and the RLQS presence loop's calls.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use opentelemetry::KeyValue;

use crate::global::{Fleet, Global, ShardHealth, SyncQueues, SyncStats};
use crate::telemetry::{names, SeriesFn, Telemetry};

pub(super) fn register_metrics(
    t: &Telemetry,
    g: &Global,
    queues: &Arc<SyncQueues>,
    fleet: &Arc<Fleet>,
) {
    let s = queues.stats.clone();
    let counters: [crate::telemetry::CounterRow<SyncStats>; 9] = [
        (names::SYNC_TICKS, |s| s.ticks.load(Ordering::Relaxed)),
        (names::SYNC_ITEMS, |s| s.items_sent.load(Ordering::Relaxed)),
        (names::REDIS_COMMANDS, |s| {
            s.commands_sent.load(Ordering::Relaxed)
        }),
        (names::SYNC_DELTAS_DROPPED, |s| {
            s.deltas_dropped.load(Ordering::Relaxed)
        }),
        (names::SYNC_TIER_TRANSITIONS, |s| {
            s.tier_transitions.load(Ordering::Relaxed)
        }),
        (names::SYNC_ESTIMATE_DRIFT, |s| {
            s.drift_hits.load(Ordering::Relaxed)
        }),
        (names::SYNC_CALL_SECONDS, |s| {
            s.call_micros.load(Ordering::Relaxed) / 1_000_000
        }),
        (names::SYNC_TASK_FAILURES, |s| {
            s.task_failures.load(Ordering::Relaxed)
        }),
        (names::REDIS_ERRORS, |s| {
            s.calls_failed.load(Ordering::Relaxed)
        }),
    ];
    t.counter_table(&s, &counters);
    register_labelled_counters(t, &s);
    register_shard_gauges(t, g, queues, fleet);
    register_presence(t, g);
}

/// The RLQS presence loop's counters (`presence/`): calls by result, counters sent.
fn register_presence(t: &Telemetry, g: &Global) {
    let stats = g.presence.clone();
    t.counter(
        names::PRESENCE_CALLS,
        Arc::new(move || {
            let s = &stats;
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
    let stats = g.presence.clone();
    t.counter(
        names::PRESENCE_ITEMS,
        Arc::new(move || vec![(stats.items_sent.load(Ordering::Relaxed), vec![])]),
    );
}

/// The sync's counters with a label: calls by result, entities by tier.
fn register_labelled_counters(t: &Telemetry, s: &Arc<SyncStats>) {
    let s2 = s.clone();
    t.counter(
        names::SYNC_CALLS,
        Arc::new(move || {
            vec![
                (
                    s2.calls_ok.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "ok")],
                ),
                (
                    s2.calls_failed.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "error")],
                ),
                (
                    s2.calls_resized.load(Ordering::Relaxed),
                    vec![KeyValue::new("result", "resized")],
                ),
            ]
        }),
    );
    let s3 = s.clone();
    t.counter(
        names::SYNC_ENTITIES,
        Arc::new(move || {
            ["idle", "low", "normal", "hot"]
                .iter()
                .zip(&s3.synced_by_tier)
                .map(|(tier, n)| {
                    (
                        n.load(Ordering::Relaxed),
                        vec![KeyValue::new("tier", *tier)],
                    )
                })
                .collect()
        }),
    );
}

/// Gauges of the queues and of each shard's health.
fn register_shard_gauges(t: &Telemetry, g: &Global, queues: &Arc<SyncQueues>, fleet: &Arc<Fleet>) {
    let q = queues.clone();
    t.gauge(
        names::SYNC_PENDING_ENTITIES,
        Arc::new(move || q.len() as u64),
    );
    let f = fleet.clone();
    t.gauge(
        names::SYNC_LIVE_REPLICAS,
        Arc::new(move || u64::from(f.live_replicas())),
    );
    type PerShard = fn(&ShardHealth) -> u64;
    let per_shard: [(crate::telemetry::Metric, PerShard); 3] = [
        (names::REDIS_SHARD_DEGRADED, |h| u64::from(h.is_degraded())),
        (names::REDIS_LAST_SYNC, |h| h.last_success_ms() / 1000),
        (names::SYNC_BATCH_ITEMS, |h| h.batch.get() as u64),
    ];
    for (metric, read) in per_shard {
        t.labelled_gauge(metric, per_shard_reader(g, read));
    }
    t.counter(
        names::SYNC_STORE_RESETS,
        per_shard_reader(g, ShardHealth::resets),
    );
    t.counter(
        names::RESET_LOG_APPLIED,
        per_shard_reader(g, |h| h.reset_log.applied()),
    );
    t.counter(
        names::RESET_LOG_MISSED,
        per_shard_reader(g, |h| h.reset_log.missed()),
    );
}

/// Reads `read` of each shard's health, labelled by the shard.
fn per_shard_reader(g: &Global, read: fn(&ShardHealth) -> u64) -> SeriesFn {
    let health = g.health.clone();
    Arc::new(move || {
        health
            .iter()
            .map(|h| (read(h), vec![KeyValue::new("shard", h.name.clone())]))
            .collect()
    })
}
