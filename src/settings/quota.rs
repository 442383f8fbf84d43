//! The quota service's settings: `RLQS_*`, into `rlqs::Config` (`None`: not served).

use std::time::Duration;

use super::source::{at_least_one, boolean, duration, ValueError, Values};
use crate::rlqs::{Config, UnknownBuckets};

/// `RLQS_ENABLED` and the service's bounds; `None` when it is off.
pub(super) fn rlqs(v: &mut Values<'_>) -> Option<Config> {
    let on = v.or("RLQS_ENABLED", true, boolean);
    let unknown = v.or("RLQS_UNKNOWN_BUCKETS", UnknownBuckets::default(), |s| {
        UnknownBuckets::parse(s).map_err(|e| ValueError::NotBucketActions(e.to_string()))
    });
    let config = Config {
        max_streams: v.or("RLQS_MAX_STREAMS", 1, at_least_one),
        max_buckets_per_stream: v.or("RLQS_MAX_BUCKETS_PER_STREAM", 1, at_least_one),
        max_buckets: v.or("RLQS_MAX_BUCKETS", 1, at_least_one),
        max_bucket_id_bytes: v.or("RLQS_MAX_BUCKET_ID_BYTES", 1, at_least_one),
        max_tracked_id_bytes: v.or("RLQS_MAX_TRACKED_ID_BYTES", 1, at_least_one),
        assignment_ttl: v.or("RLQS_ASSIGNMENT_TTL", Duration::from_secs(1), whole_seconds),
        abandon_after: v.or(
            "RLQS_ABANDON_AFTER",
            Duration::from_secs(1),
            at_least_a_second,
        ),
        unknown,
    };
    on.then_some(config)
}

/// A duration of whole seconds, at least one: Envoy reads a TTL in whole seconds and drops
/// one under a second at once.
fn whole_seconds(s: &str) -> Result<Duration, ValueError> {
    let d = duration(s)?;
    if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
        return Err(ValueError::NotWholeSeconds);
    }
    Ok(d)
}

/// A duration of at least a second.
fn at_least_a_second(s: &str) -> Result<Duration, ValueError> {
    let d = duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(ValueError::UnderASecond);
    }
    Ok(d)
}
