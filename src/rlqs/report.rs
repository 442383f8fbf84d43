//! One `RateLimitQuotaUsageReports` message, read from its bytes and checked against the
//! protocol and sluice's bounds before anything is resolved or counted: typed per-bucket
//! usage, or the error whose text is the stream's `INVALID_ARGUMENT` message.
//!
//! What Envoy 1.40 sends, and so what is valid: the domain on the stream's first message
//! (later ones may repeat it or leave it empty); every bucket of the filter each report, with
//! the requests it allowed and denied since its last report; and `time_elapsed` present on
//! every usage, zero on a new bucket's first report (sent at once, before any interval passed).
//!
//! The message is read in place, as protobuf's wire format defines it (what prost's generated
//! decoding accepts, this accepts the same; a test holds the two to each other): keys and
//! values borrow the message's bytes. Decoding it into envoy-types' structs built a map and two
//! strings per bucket, thousands a report, and freeing them made glibc's next large
//! allocation (the connection's read buffer) sort them all: together most of a report's cost.

use std::ops::Range;
use std::time::Duration;

use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};

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
    pub usages: Vec<Usage>,
    /// Every usage's bucket id entries, each usage's a range (`Usage::entries`).
    entries: Vec<(&'a str, &'a str)>,
}

/// One bucket's checked usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Its bucket id's entries in [`Report::bucket`].
    entries: Range<usize>,
    /// The time since the bucket's last report; zero on its first.
    pub elapsed: Duration,
    /// The requests reported.
    pub counts: Counts,
}

// === impl Report ===

impl<'a> Report<'a> {
    /// `usage`'s bucket id: 1 to [`MAX_BUCKET_ENTRIES`] entries sorted by key, keys distinct
    /// and non-empty, values non-empty, each at most [`MAX_BUCKET_BYTES`].
    pub fn bucket(&self, usage: &Usage) -> &[(&'a str, &'a str)] {
        &self.entries[usage.entries.clone()]
    }
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
    /// Bytes that are not a `RateLimitQuotaUsageReports` message: a truncated or malformed
    /// field, a known field of the wrong wire type, a string that is not UTF-8.
    #[error("the report is not a valid RateLimitQuotaUsageReports message: {0}")]
    Malformed(String),
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
    /// A bucket id with more than [`MAX_BUCKET_ENTRIES`] entries (as sent: a key sent twice
    /// counts twice).
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
    /// A bucket id whose keys and values are more than `RLQS_MAX_BUCKET_ID_BYTES` together.
    #[error("bucket usage {index}: the bucket_id's keys and values are {len} bytes, more than RLQS_MAX_BUCKET_ID_BYTES ({max})")]
    IdTooLong {
        /// The usage's position.
        index: usize,
        /// Its keys' and values' bytes ([`text_len`]).
        len: usize,
        /// The bound.
        max: usize,
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

/// Reads and checks one message of a stream whose domain is `stream` (`None` before its first
/// message), in the message's order, its bucket ids' keys and values at most `max_id_bytes`
/// each (`RLQS_MAX_BUCKET_ID_BYTES`).
///
/// # Errors
/// A message that is not valid protobuf, then the first problem found: the message's, then
/// each usage's in order.
pub fn check<'a>(
    msg: &'a [u8],
    stream: Option<&'a str>,
    max_id_bytes: usize,
) -> Result<Report<'a>, ReportError> {
    let mut raw = Raw::default();
    read_message(msg, &mut raw).map_err(|e| ReportError::Malformed(e.0))?;
    let domain = domain(raw.domain, stream)?;
    if raw.count > MAX_USAGES_PER_REPORT {
        return Err(ReportError::TooManyUsages { count: raw.count });
    }
    let usages = raw
        .usages
        .iter()
        .enumerate()
        .map(|(index, u)| usage(index, u, &mut raw.entries, max_id_bytes))
        .collect::<Result<_, _>>()?;
    Ok(Report {
        domain,
        usages,
        entries: raw.entries,
    })
}

/// A message as read, before its checks.
#[derive(Default)]
struct Raw<'a> {
    domain: &'a str,
    /// Usages in the message, read or not (past [`MAX_USAGES_PER_REPORT`] they are only
    /// counted).
    count: usize,
    usages: Vec<RawUsage>,
    entries: Vec<(&'a str, &'a str)>,
}

/// A `BucketQuotaUsage` as read: its entries as sent (a range of `Raw::entries`), how many
/// (past [`MAX_BUCKET_ENTRIES`] they are only counted).
#[derive(Default)]
struct RawUsage {
    bucket: Option<Range<usize>>,
    sent: usize,
    elapsed: Option<(i64, i32)>,
    counts: Counts,
}

type Wire<T> = Result<T, WireError>;

/// Why the bytes are not the message: prost's own words where its primitives found it.
struct WireError(String);

impl From<prost::DecodeError> for WireError {
    fn from(e: prost::DecodeError) -> Self {
        WireError(e.to_string())
    }
}

/// `RateLimitQuotaUsageReports`: `domain` = 1, `bucket_quota_usages` = 2.
fn read_message<'a>(mut buf: &'a [u8], raw: &mut Raw<'a>) -> Wire<()> {
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf)?;
        match tag {
            1 => raw.domain = string(wire, &mut buf)?,
            2 => {
                let body = bytes(wire, &mut buf)?;
                raw.count += 1;
                if raw.count <= MAX_USAGES_PER_REPORT {
                    let u = read_usage(body, &mut raw.entries)?;
                    raw.usages.push(u);
                }
            }
            _ => skip(wire, tag, &mut buf)?,
        }
    }
    Ok(())
}

/// `BucketQuotaUsage`: `bucket_id` = 1, `time_elapsed` = 2, `num_requests_allowed` = 3,
/// `num_requests_denied` = 4. A message field sent twice merges (protobuf's rule): a second
/// `bucket_id` adds its entries, a second `time_elapsed` overrides the fields it carries.
fn read_usage<'a>(mut buf: &'a [u8], entries: &mut Vec<(&'a str, &'a str)>) -> Wire<RawUsage> {
    let start = entries.len();
    let mut u = RawUsage::default();
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf)?;
        match tag {
            1 => {
                let body = bytes(wire, &mut buf)?;
                u.bucket = Some(start..start);
                read_bucket(body, entries, start, &mut u.sent)?;
            }
            2 => {
                let body = bytes(wire, &mut buf)?;
                let (s, n) = u.elapsed.unwrap_or_default();
                u.elapsed = Some(read_duration(body, s, n)?);
            }
            3 => u.counts.allowed = varint(wire, &mut buf)?,
            4 => u.counts.denied = varint(wire, &mut buf)?,
            _ => skip(wire, tag, &mut buf)?,
        }
    }
    if let Some(range) = &mut u.bucket {
        *range = start..entries.len();
    }
    Ok(u)
}

/// `BucketId`: its `map<string, string> bucket` = 1, each entry a message of `key` = 1 and
/// `value` = 2 (absent: empty). Entries past [`MAX_BUCKET_ENTRIES`] of the usage (from
/// `start` in `entries`) are only counted in `sent`.
fn read_bucket<'a>(
    mut buf: &'a [u8],
    entries: &mut Vec<(&'a str, &'a str)>,
    start: usize,
    sent: &mut usize,
) -> Wire<()> {
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf)?;
        if tag != 1 {
            skip(wire, tag, &mut buf)?;
            continue;
        }
        let mut entry = bytes(wire, &mut buf)?;
        let (mut key, mut value) = ("", "");
        while !entry.is_empty() {
            let (tag, wire) = decode_key(&mut entry)?;
            match tag {
                1 => key = string(wire, &mut entry)?,
                2 => value = string(wire, &mut entry)?,
                _ => skip(wire, tag, &mut entry)?,
            }
        }
        *sent += 1;
        if entries.len() - start < MAX_BUCKET_ENTRIES {
            entries.push((key, value));
        }
    }
    Ok(())
}

/// `google.protobuf.Duration`: `seconds` = 1 (int64), `nanos` = 2 (int32), over `(s, n)`.
fn read_duration(mut buf: &[u8], mut s: i64, mut n: i32) -> Wire<(i64, i32)> {
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf)?;
        match tag {
            // Two's complement in a varint, as protobuf's int64 and int32 are: the casts
            // are the wire format's own.
            1 => s = varint(wire, &mut buf)? as i64,
            2 => n = varint(wire, &mut buf)? as i32,
            _ => skip(wire, tag, &mut buf)?,
        }
    }
    Ok((s, n))
}

fn expect(want: WireType, got: WireType) -> Wire<()> {
    Ok(prost::encoding::check_wire_type(want, got)?)
}

fn varint(wire: WireType, buf: &mut &[u8]) -> Wire<u64> {
    expect(WireType::Varint, wire)?;
    Ok(decode_varint(buf)?)
}

fn bytes<'a>(wire: WireType, buf: &mut &'a [u8]) -> Wire<&'a [u8]> {
    expect(WireType::LengthDelimited, wire)?;
    let len = decode_varint(buf)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= buf.len())
        .ok_or_else(|| WireError("buffer underflow".into()))?;
    let (field, rest) = buf.split_at(len);
    *buf = rest;
    Ok(field)
}

fn string<'a>(wire: WireType, buf: &mut &'a [u8]) -> Wire<&'a str> {
    std::str::from_utf8(bytes(wire, buf)?)
        .map_err(|_| WireError("invalid string value: data is not UTF-8 encoded".into()))
}

fn skip(wire: WireType, tag: u32, buf: &mut &[u8]) -> Wire<()> {
    Ok(skip_field(wire, tag, buf, DecodeContext::default())?)
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

/// One usage, at `index` in the message: its entries (in `entries`) sorted by key, a key sent
/// twice keeping its last value (a map's rule), then checked.
fn usage(
    index: usize,
    u: &RawUsage,
    entries: &mut [(&str, &str)],
    max_id_bytes: usize,
) -> Result<Usage, ReportError> {
    let range = u.bucket.clone().ok_or(ReportError::NoBucketId { index })?;
    if u.sent > MAX_BUCKET_ENTRIES {
        return Err(ReportError::TooManyEntries {
            index,
            count: u.sent,
        });
    }
    let bucket = &mut entries[range.clone()];
    // Stable: of a key's entries, the last sent stays last.
    bucket.sort_by(|a, b| a.0.cmp(b.0));
    let mut kept = 0;
    for i in 0..bucket.len() {
        if bucket.get(i + 1).is_some_and(|next| next.0 == bucket[i].0) {
            continue;
        }
        bucket[kept] = bucket[i];
        kept += 1;
    }
    let range = range.start..range.start + kept;
    check_bucket(index, &entries[range.clone()], max_id_bytes)?;
    let (seconds, nanos) = u.elapsed.ok_or(ReportError::NoTimeElapsed { index })?;
    Ok(Usage {
        entries: range,
        elapsed: elapsed(index, seconds, nanos)?,
        counts: u.counts,
    })
}

/// A bucket id's entries (sorted by key, distinct): how many, how long, none empty.
fn check_bucket(
    index: usize,
    bucket: &[(&str, &str)],
    max_id_bytes: usize,
) -> Result<(), ReportError> {
    if bucket.is_empty() {
        return Err(ReportError::EmptyBucket { index });
    }
    let len = bucket
        .iter()
        .map(|(k, v)| k.len().max(v.len()))
        .max()
        .unwrap_or(0);
    if len > MAX_BUCKET_BYTES {
        return Err(ReportError::EntryTooLong { index, len });
    }
    let len = text_len(bucket.iter().copied());
    if len > max_id_bytes {
        return Err(ReportError::IdTooLong {
            index,
            len,
            max: max_id_bytes,
        });
    }
    if bucket[0].0.is_empty() {
        return Err(ReportError::EmptyKey { index });
    }
    if let Some((key, _)) = bucket.iter().find(|(_, v)| v.is_empty()) {
        return Err(ReportError::EmptyValue {
            index,
            key: (*key).to_owned(),
        });
    }
    Ok(())
}

/// The bytes of a bucket id's keys and values together: what `RLQS_MAX_BUCKET_ID_BYTES` bounds
/// in one id and `RLQS_MAX_TRACKED_ID_BYTES` in every tracked one.
pub fn text_len<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> usize {
    entries.into_iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// `time_elapsed` as a duration: zero or more, at most [`MAX_TIME_ELAPSED`].
fn elapsed(index: usize, seconds: i64, nanos: i32) -> Result<Duration, ReportError> {
    let bad = || ReportError::BadTimeElapsed {
        index,
        seconds,
        nanos,
    };
    // proto3's Duration: nanos in (-1e9, 1e9) with the sign of seconds; so a non-negative
    // one has both at zero or more.
    let (Ok(s), Ok(n)) = (u64::try_from(seconds), u32::try_from(nanos)) else {
        return Err(bad());
    };
    if n >= 1_000_000_000 {
        return Err(bad());
    }
    let elapsed = Duration::new(s, n);
    if elapsed > MAX_TIME_ELAPSED {
        return Err(ReportError::TimeElapsedTooLong { index, seconds });
    }
    Ok(elapsed)
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
