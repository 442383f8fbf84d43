//! The quota service's metrics (`telemetry`): its streams, buckets, reports, assignments by
//! kind, refusals and abandons, read from the engine's counters at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::engine::{QuotaStats, Quotas};

/// Registers the quota service's metrics, read from `quotas` at scrape time.
pub fn register_metrics(telemetry: &crate::telemetry::Telemetry, quotas: &Arc<Quotas>) {
    use crate::telemetry::names;
    use opentelemetry::KeyValue;
    let q = quotas.clone();
    telemetry.gauge(
        names::RLQS_STREAMS,
        Arc::new(move || q.stream_count() as u64),
    );
    let q = quotas.clone();
    telemetry.gauge(
        names::RLQS_BUCKETS,
        Arc::new(move || q.bucket_count() as u64),
    );
    let q = quotas.clone();
    let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
    telemetry.counter(
        names::RLQS_REPORTS,
        Arc::new(move || vec![(read(&q.stats.reports), vec![])]),
    );
    let labelled = |q: &Arc<Quotas>,
                    label: &'static str,
                    rows: fn(&QuotaStats) -> [(&'static str, &AtomicU64); 3]| {
        let q = q.clone();
        Arc::new(move || {
            rows(&q.stats)
                .into_iter()
                .map(|(v, n)| (read(n), vec![KeyValue::new(label, v)]))
                .collect()
        }) as Arc<dyn Fn() -> Vec<(u64, Vec<KeyValue>)> + Send + Sync>
    };
    telemetry.counter(
        names::RLQS_ASSIGNMENTS,
        labelled(quotas, "kind", |s| {
            [
                ("token_bucket", &s.token_bucket),
                ("deny_all", &s.deny_all),
                ("allow_all", &s.allow_all),
            ]
        }),
    );
    telemetry.counter(
        names::RLQS_REFUSED,
        labelled(quotas, "what", |s| {
            [
                ("stream", &s.streams_refused),
                ("bucket", &s.buckets_refused),
                ("report", &s.stream_errors),
            ]
        }),
    );
    let q = quotas.clone();
    telemetry.counter(
        names::RLQS_ABANDONS,
        Arc::new(move || vec![(read(&q.stats.abandons), vec![])]),
    );
}
