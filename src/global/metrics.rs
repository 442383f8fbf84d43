//! Global mode's metrics: the sync's counters (ticks, items, Redis calls, failures), the
//! queue's gauges and each shard's health, read from [`SyncStats`] and [`ShardHealth`] at
//! each collection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use opentelemetry::KeyValue;

use crate::global::{Global, ShardHealth, SyncStats};
use crate::telemetry::Telemetry;

pub(super) fn register_metrics(t: &Telemetry, g: &Global) {
    let s = g.queues.stats.clone();
    let counters: [crate::telemetry::CounterRow<SyncStats>; 9] = [
        ("sluice_sync_ticks_total", "Sync ticks, all shards", |s| {
            s.ticks.load(Ordering::Relaxed)
        }),
        (
            "sluice_sync_items_total",
            "Entity limits sent in syncs",
            |s| s.items_sent.load(Ordering::Relaxed),
        ),
        (
            "sluice_redis_commands_total",
            "Commands sent to Redis by syncs",
            |s| s.commands_sent.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_deltas_dropped_total",
            "Hits that could not be kept for sync",
            |s| s.deltas_dropped.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_tier_transitions_total",
            "Entities whose pressure tier changed at a sync",
            |s| s.tier_transitions.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_estimate_drift_hits_total",
            "Sum of |estimate after a sync - before|, in hits",
            |s| s.drift_hits.load(Ordering::Relaxed),
        ),
        (
            "sluice_sync_call_seconds_total",
            "Time spent in Redis sync calls (microseconds / 1e6)",
            |s| s.call_micros.load(Ordering::Relaxed) / 1_000_000,
        ),
        (
            "sluice_sync_task_failures_total",
            "Sync and clock-offset tasks that panicked or ended before shutdown (each restarted)",
            |s| s.task_failures.load(Ordering::Relaxed),
        ),
        (
            "sluice_redis_errors_total",
            "Failed Redis sync calls",
            |s| s.calls_failed.load(Ordering::Relaxed),
        ),
    ];
    t.counter_table(&s, &counters);
    register_labelled_counters(t, &s);
    register_shard_gauges(t, g);
}

/// The sync's counters with a label: calls by result, entities by tier.
fn register_labelled_counters(t: &Telemetry, s: &Arc<SyncStats>) {
    let s2 = s.clone();
    t.counter(
        "sluice_sync_calls_total",
        "Redis sync calls, by result",
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
            ]
        }),
    );
    let s3 = s.clone();
    t.counter(
        "sluice_sync_entities_total",
        "Entity limits synced, by pressure tier at the sync",
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
fn register_shard_gauges(t: &Telemetry, g: &Global) {
    let q = g.queues.clone();
    t.gauge(
        "sluice_sync_pending_entities",
        "Entities waiting to sync",
        Arc::new(move || q.len() as u64),
    );
    let q = g.queues.clone();
    t.gauge(
        "sluice_sync_live_replicas",
        "Live replicas (this one included) as the Redis heartbeats last counted them",
        Arc::new(move || u64::from(q.live_replicas())),
    );
    type PerShard = fn(&ShardHealth) -> u64;
    let per_shard: [(&'static str, &'static str, PerShard); 2] = [
        (
            "sluice_redis_shard_degraded",
            "1 while a Redis shard's last call failed",
            |h| u64::from(h.is_degraded()),
        ),
        (
            "sluice_redis_last_sync_unix_seconds",
            "When a shard's last sync succeeded (staleness = now - this)",
            |h| h.last_success_ms() / 1000,
        ),
    ];
    for (name, help, read) in per_shard {
        let health = g.health.clone();
        t.labelled_gauge(
            name,
            help,
            Arc::new(move || {
                health
                    .iter()
                    .map(|h| (read(h), vec![KeyValue::new("shard", h.name.clone())]))
                    .collect()
            }),
        );
    }
}
