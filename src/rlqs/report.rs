//! One `RateLimitQuotaUsageReports` message checked against the protocol and sluice's bounds,
//! before anything is resolved or counted: typed per-bucket usage, or the error whose text is
//! the stream's `INVALID_ARGUMENT` message.
//!
//! What Envoy 1.40 sends, and so what is valid: the domain on the stream's first message
//! (later ones may repeat it or leave it empty); every bucket of the filter each report, with
//! the requests it allowed and denied since its last report; and `time_elapsed` present on
//! every usage, zero on a new bucket's first report (sent at once, before any interval passed).

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use crate::rules::MAX_BUCKET_ENTRIES;

/// The most bucket usages one message may carry. Envoy sends every bucket of a filter in one
/// message each interval, so this is also the most buckets one Envoy can report: far above
/// a real fan-out (a bucket per tenant or route of one listener), while it caps the work of
/// one message at this many bucket resolutions. tonic's 4 MiB message limit alone would
/// allow some 300,000 one-entry usages. The memory a stream's buckets hold is bounded
/// separately, across its messages.
pub const MAX_USAGES_PER_REPORT: usize = 65_536;

/// The most bytes of a bucket id's key or value, and of the domain: the default of
/// `MAX_VALUE_BYTES`, which bounds a `ShouldRateLimit` descriptor's the same way, so a bucket
/// can carry whatever a default descriptor can.
pub const MAX_BUCKET_BYTES: usize = 4096;

/// The longest `time_elapsed` accepted. Envoy 1.40 reports every 5 s whatever its
/// `reporting_interval` says: an hour is 720 of its intervals, long past the point where
/// every assignment it held has expired. A longer one is a broken clock or a client that is
/// not Envoy, and would turn its counts into a demand rate of almost nothing.
pub const MAX_TIME_ELAPSED: Duration = Duration::from_secs(3600);

/// A checked message: the stream's domain and its usages, in the message's order (the
/// protocol processes them in order; a bucket listed twice is two usages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report<'a> {
    /// The domain: the message's, or the stream's when the message leaves it empty.
    pub domain: &'a str,
    /// One per `bucket_quota_usages` entry.
    pub usages: Vec<Usage<'a>>,
}

/// One bucket's checked usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage<'a> {
    /// The bucket id: 1 to [`MAX_BUCKET_ENTRIES`] entries, keys and values non-empty and at
    /// most [`MAX_BUCKET_BYTES`].
    pub bucket: &'a HashMap<String, String>,
    /// The time since the bucket's last report; zero on its first.
    pub elapsed: Duration,
    /// The requests reported.
    pub counts: Counts,
}

/// Requests a data plane allowed and denied. Counts come from the client and may be anything
/// up to `u64::MAX`: every sum saturates, so a hostile or broken client can make a demand
/// look infinite but never wrap it to small.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// `num_requests_allowed`.
    pub allowed: u64,
    /// `num_requests_denied`.
    pub denied: u64,
}

// === impl Counts ===

impl Counts {
    /// The demand: every request the data plane saw, allowed or denied.
    pub fn demand(self) -> u64 {
        self.allowed.saturating_add(self.denied)
    }

    /// These counts and `other`'s together (two reports of one bucket, or many Envoys').
    #[must_use]
    pub fn saturating_add(self, other: Counts) -> Counts {
        Counts {
            allowed: self.allowed.saturating_add(other.allowed),
            denied: self.denied.saturating_add(other.denied),
        }
    }
}

/// Why a message was refused. The text is the stream's `INVALID_ARGUMENT` message: it names
/// the problem, and the usage by its position in `bucket_quota_usages`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The stream's first message has no domain.
    #[error("the stream's first report must name a domain")]
    NoDomain,
    /// A later message names another domain than the stream's.
    #[error("the report's domain {got:?} is not the stream's {stream:?}: open a new stream to change domains")]
    DomainChanged {
        /// The stream's domain.
        stream: String,
        /// The message's.
        got: String,
    },
    /// The domain is longer than [`MAX_BUCKET_BYTES`].
    #[error("the domain is {len} bytes, more than {MAX_BUCKET_BYTES}")]
    DomainTooLong {
        /// Its length.
        len: usize,
    },
    /// More usages than [`MAX_USAGES_PER_REPORT`].
    #[error("{count} bucket usages in one report, more than {MAX_USAGES_PER_REPORT}")]
    TooManyUsages {
        /// How many.
        count: usize,
    },
    /// A usage without `bucket_id`.
    #[error("bucket usage {index}: no bucket_id")]
    NoBucketId {
        /// The usage's position.
        index: usize,
    },
    /// A bucket id with no entries.
    #[error("bucket usage {index}: the bucket_id is an empty map")]
    EmptyBucket {
        /// The usage's position.
        index: usize,
    },
    /// A bucket id with more than [`MAX_BUCKET_ENTRIES`] entries.
    #[error(
        "bucket usage {index}: the bucket_id has {count} entries, more than {MAX_BUCKET_ENTRIES}"
    )]
    TooManyEntries {
        /// The usage's position.
        index: usize,
        /// How many.
        count: usize,
    },
    /// A bucket id key or value longer than [`MAX_BUCKET_BYTES`].
    #[error("bucket usage {index}: a bucket_id key or value of {len} bytes, more than {MAX_BUCKET_BYTES}")]
    EntryTooLong {
        /// The usage's position.
        index: usize,
        /// The longest key or value.
        len: usize,
    },
    /// A bucket id entry with an empty key.
    #[error("bucket usage {index}: a bucket_id key is empty")]
    EmptyKey {
        /// The usage's position.
        index: usize,
    },
    /// A bucket id entry with an empty value.
    #[error("bucket usage {index}: the bucket_id's {key:?} has an empty value")]
    EmptyValue {
        /// The usage's position.
        index: usize,
        /// The first such key, bytewise.
        key: String,
    },
    /// A usage without `time_elapsed` (zero is valid: a bucket's first report).
    #[error("bucket usage {index}: no time_elapsed")]
    NoTimeElapsed {
        /// The usage's position.
        index: usize,
    },
    /// A negative `time_elapsed`, or one whose nanos are out of range.
    #[error(
        "bucket usage {index}: time_elapsed {seconds}s {nanos}ns is not a duration of zero or more"
    )]
    BadTimeElapsed {
        /// The usage's position.
        index: usize,
        /// Its seconds.
        seconds: i64,
        /// Its nanos.
        nanos: i32,
    },
    /// A `time_elapsed` longer than [`MAX_TIME_ELAPSED`].
    #[error("bucket usage {index}: time_elapsed of {seconds}s is more than {}s", MAX_TIME_ELAPSED.as_secs())]
    TimeElapsedTooLong {
        /// The usage's position.
        index: usize,
        /// Its seconds.
        seconds: i64,
    },
}

/// Checks one message of a stream whose domain is `stream` (`None` before its first
/// message), in the message's order.
///
/// # Errors
/// The first problem found: the message's, then each usage's in order.
pub fn check<'a>(
    reports: &'a RateLimitQuotaUsageReports,
    stream: Option<&'a str>,
) -> Result<Report<'a>, ReportError> {
    let domain = domain(&reports.domain, stream)?;
    let count = reports.bucket_quota_usages.len();
    if count > MAX_USAGES_PER_REPORT {
        return Err(ReportError::TooManyUsages { count });
    }
    let usages = reports
        .bucket_quota_usages
        .iter()
        .enumerate()
        .map(|(index, u)| usage(index, u))
        .collect::<Result<_, _>>()?;
    Ok(Report { domain, usages })
}

/// The message's domain, checked against the stream's.
fn domain<'a>(message: &'a str, stream: Option<&'a str>) -> Result<&'a str, ReportError> {
    if message.len() > MAX_BUCKET_BYTES {
        return Err(ReportError::DomainTooLong { len: message.len() });
    }
    match stream {
        None if message.is_empty() => Err(ReportError::NoDomain),
        None => Ok(message),
        Some(s) if message.is_empty() || message == s => Ok(s),
        Some(s) => Err(ReportError::DomainChanged {
            stream: s.to_owned(),
            got: message.to_owned(),
        }),
    }
}

/// One usage, at `index` in the message.
fn usage(index: usize, u: &BucketQuotaUsage) -> Result<Usage<'_>, ReportError> {
    let bucket = &u
        .bucket_id
        .as_ref()
        .ok_or(ReportError::NoBucketId { index })?
        .bucket;
    check_bucket(index, bucket)?;
    let elapsed = elapsed(index, u.time_elapsed.as_ref())?;
    Ok(Usage {
        bucket,
        elapsed,
        counts: Counts {
            allowed: u.num_requests_allowed,
            denied: u.num_requests_denied,
        },
    })
}

/// A bucket id's entries: how many, how long, none empty. Each problem is reported the same
/// whatever order the map iterates in (the longest entry, the first empty value's key).
fn check_bucket(index: usize, bucket: &HashMap<String, String>) -> Result<(), ReportError> {
    if bucket.is_empty() {
        return Err(ReportError::EmptyBucket { index });
    }
    if bucket.len() > MAX_BUCKET_ENTRIES {
        return Err(ReportError::TooManyEntries {
            index,
            count: bucket.len(),
        });
    }
    let len = bucket
        .iter()
        .map(|(k, v)| k.len().max(v.len()))
        .max()
        .unwrap_or(0);
    if len > MAX_BUCKET_BYTES {
        return Err(ReportError::EntryTooLong { index, len });
    }
    if bucket.contains_key("") {
        return Err(ReportError::EmptyKey { index });
    }
    if let Some(key) = bucket
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(k, _)| k)
        .min()
    {
        return Err(ReportError::EmptyValue {
            index,
            key: key.clone(),
        });
    }
    Ok(())
}

/// `time_elapsed` as a duration: present, zero or more, at most [`MAX_TIME_ELAPSED`].
fn elapsed(index: usize, d: Option<&PbDuration>) -> Result<Duration, ReportError> {
    let d = d.ok_or(ReportError::NoTimeElapsed { index })?;
    // proto3's Duration: nanos in (-1e9, 1e9) with the sign of seconds; so a non-negative
    // one has both at zero or more.
    let (Ok(seconds), Ok(nanos)) = (u64::try_from(d.seconds), u32::try_from(d.nanos)) else {
        return Err(bad(index, d));
    };
    if nanos >= 1_000_000_000 {
        return Err(bad(index, d));
    }
    let elapsed = Duration::new(seconds, nanos);
    if elapsed > MAX_TIME_ELAPSED {
        return Err(ReportError::TimeElapsedTooLong {
            index,
            seconds: d.seconds,
        });
    }
    Ok(elapsed)
}

fn bad(index: usize, d: &PbDuration) -> ReportError {
    ReportError::BadTimeElapsed {
        index,
        seconds: d.seconds,
        nanos: d.nanos,
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
