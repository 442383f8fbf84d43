//! The entity table's metrics: its size and capacity, the entities that left it by kind,
//! those restored from its sketch and those added past its bound, read from the table at
//! each collection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::table::EntityTable;
use crate::telemetry::{names, Telemetry};

/// Registers the metrics of `table` (the limiter's, `RateLimiter::new`).
pub(super) fn register(telemetry: &Telemetry, table: &EntityTable) {
    let entities = table.clone();
    telemetry.gauge(names::ENTITIES, Arc::new(move || entities.len()));
    let entities = table.clone();
    telemetry.gauge(
        names::ENTITY_TABLE_CAPACITY,
        Arc::new(move || entities.capacity()),
    );
    let entities = table.clone();
    telemetry.counter(
        names::ENTITY_EVICTIONS,
        Arc::new(move || {
            let s = entities.stats();
            [
                ("free", &s.evicted_free),
                ("live", &s.evicted_live),
                ("idle", &s.expired_idle),
                ("ttl", &s.expired_ttl),
            ]
            .into_iter()
            .map(|(kind, n)| {
                (
                    n.load(Ordering::Relaxed),
                    vec![opentelemetry::KeyValue::new("kind", kind)],
                )
            })
            .collect()
        }),
    );
    let entities = table.clone();
    telemetry.counter(
        names::ENTITY_RESTORED,
        Arc::new(move || vec![(entities.stats().restored.load(Ordering::Relaxed), vec![])]),
    );
    let entities = table.clone();
    telemetry.counter(
        names::ENTITY_OVER_BOUND,
        Arc::new(move || vec![(entities.stats().over_bound.load(Ordering::Relaxed), vec![])]),
    );
}
