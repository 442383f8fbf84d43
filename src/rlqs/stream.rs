//! One Envoy stream of the quota service ([`Stream`]): its domain, the buckets it reported,
//! each resolved to its rule's counter and joined to that counter's shares; what a report
//! does ([`Stream::report`]: count, observe, assign) and what the periodic refresh does
//! ([`Stream::refresh`]: new shares, TTL renewals, deny-alls that end, abandons). Each returns
//! the bucket actions to send, encoded (`response.rs`). No transport: `server/rlqs.rs` carries
//! the messages.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::core::clock::UnixMillis;
use crate::rls::{Compiled, QuotaCount};

use super::engine::{room_of, Quotas, Seat, Share};
use super::replace::{hold, must_send, to_send, Pressure};
use super::report::{check, text_len, Counts, ReportError};
use super::response::{Actions, StoredId};
use super::share::{Assignment, Strategy};

/// How often a stream's assignments are looked at again between its reports.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Why a stream ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// A report the protocol or the bounds refuse (`INVALID_ARGUMENT`).
    #[error(transparent)]
    Report(#[from] ReportError),
    /// `RLQS_MAX_STREAMS` streams are open (`RESOURCE_EXHAUSTED`).
    #[error("{0} quota streams are open, the most RLQS_MAX_STREAMS allows")]
    TooManyStreams(usize),
}

/// One stream's state.
pub struct Stream {
    quotas: Arc<Quotas>,
    domain: Option<String>,
    /// The rules the buckets were resolved against.
    rules: Arc<Compiled>,
    /// Its buckets, by [`Stream::fingerprint`] of their ids: a report's bucket is found
    /// without building a key or reading the tracked id's map (Envoy reports every bucket
    /// every interval, and each map read is a cache miss or more).
    buckets: HashTable<Tracked>,
    /// The stream's own seed of `fingerprint`, so a client cannot choose buckets that collide.
    seed: u64,
    /// Reused by `fingerprint` to lay out an entry's bytes.
    scratch: Vec<u8>,
    /// New buckets refused at a bound, not logged yet.
    refused: Refused,
    /// The earliest of its buckets' `revisit`s: when its task must refresh before the next
    /// tick ([`Stream::wake_at`]).
    wake: Option<UnixMillis>,
    /// Its number in the status page's listing, and what it publishes there.
    id: u64,
    listed: Arc<super::listing::Entry>,
}

/// New buckets a stream refused (sent no assignment, counted nothing of), by the bound that
/// refused them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refused {
    /// At `RLQS_MAX_BUCKETS_PER_STREAM`.
    pub per_stream: u64,
    /// At `RLQS_MAX_BUCKETS`.
    pub buckets: u64,
    /// At `RLQS_MAX_TRACKED_ID_BYTES`.
    pub id_bytes: u64,
}

/// A bucket of the stream.
struct Tracked {
    /// `Stream::fingerprint` of its id's entries: the bucket's identity in the stream.
    fingerprint: u128,
    /// Its id, kept once: every action of the bucket carries it.
    id: StoredId,
    /// Its membership in a counter's shares: unique in the process.
    member: u64,
    /// The counter it resolved to in `Stream::rules`: `None` before it is resolved, then the
    /// rule's index and the counter, or nothing (no rule).
    resolved: Option<Option<(usize, u128)>>,
    /// Its place in that counter's shares, once it has one.
    seat: Option<Seat>,
    last: Option<(Assignment, UnixMillis)>,
    /// The room its counter left when it was last assessed: a refresh that finds it moved
    /// looks at the share again.
    room: Option<u64>,
    /// When it last saw a request.
    active_at: UnixMillis,
    /// When its share must be looked at again whatever else happens (`Share::revisit`).
    revisit: Option<UnixMillis>,
}

// === impl Stream ===

impl Stream {
    /// A new stream of `quotas`.
    ///
    /// # Errors
    /// [`StreamError::TooManyStreams`] at the bound.
    pub fn open(quotas: &Arc<Quotas>) -> Result<Stream, StreamError> {
        let max = quotas.config.max_streams;
        let open = quotas.streams.fetch_add(1, Ordering::Relaxed);
        if open >= max {
            quotas.streams.fetch_sub(1, Ordering::Relaxed);
            quotas.stats.streams_refused.fetch_add(1, Ordering::Relaxed);
            return Err(StreamError::TooManyStreams(max));
        }
        let id = quotas.next_id();
        Ok(Stream {
            id,
            listed: quotas.listing.open(id),
            rules: quotas.limiter.rules(),
            quotas: quotas.clone(),
            domain: None,
            buckets: HashTable::new(),
            // A random u64 without a dependency: std's hasher keys are random per process and
            // move on with each `RandomState`.
            seed: RandomState::new().hash_one(0u8),
            scratch: Vec::new(),
            refused: Refused::default(),
            wake: None,
        })
    }

    /// Buckets tracked.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// New buckets refused at a bound since the last call (for a log line).
    pub fn take_refused(&mut self) -> Refused {
        std::mem::take(&mut self.refused)
    }

    /// Takes one usage report (a `RateLimitQuotaUsageReports` message's bytes) at `now`: each
    /// usage counted in its rule's counter (admitted requests) and observed in its share; the
    /// actions to send back.
    ///
    /// # Errors
    /// The report's problem (nothing of it is taken then).
    pub fn report(&mut self, msg: &[u8], now: UnixMillis) -> Result<Actions, StreamError> {
        let domain = self.domain.clone();
        let report = check(
            msg,
            domain.as_deref(),
            self.quotas.config.max_bucket_id_bytes,
        )?;
        let q = self.quotas.clone();
        q.stats.reports.fetch_add(1, Ordering::Relaxed);
        if self.domain.is_none() {
            self.domain = Some(report.domain.to_string());
            self.listed.set_domain(report.domain);
        }
        self.follow_rules();
        let mut actions = Actions::default();
        for usage in &report.usages {
            let bucket = report.bucket(usage);
            let fingerprint = self.fingerprint(bucket);
            let same = |t: &Tracked| t.fingerprint == fingerprint;
            let tracked = match self.buckets.find_entry(fingerprint as u64, same) {
                Ok(found) => found.into_mut(),
                Err(absent) => {
                    let table = absent.into_table();
                    let id_bytes = text_len(bucket.iter().copied());
                    if !admit_bucket(&q, table.len(), id_bytes, &mut self.refused) {
                        continue;
                    }
                    let new = Tracked {
                        fingerprint,
                        id: StoredId::new(bucket),
                        member: q.next_id(),
                        resolved: None,
                        seat: None,
                        last: None,
                        room: None,
                        active_at: now,
                        revisit: None,
                    };
                    let rehash = |t: &Tracked| t.fingerprint as u64;
                    table
                        .insert_unique(fingerprint as u64, new, rehash)
                        .into_mut()
                }
            };
            let domain = self.domain.as_deref().unwrap_or_default();
            if usage.counts.demand() > 0 {
                tracked.active_at = now;
            }
            let usage = Some((usage.counts, usage.elapsed));
            let a = assess(&q, &self.rules, domain, tracked, Look::Report(usage), now);
            offer(&q, tracked, a, now, &mut actions);
            self.wake = earliest(self.wake, tracked.revisit);
        }
        self.listed.set_buckets(self.buckets.len());
        Ok(actions)
    }

    /// When this stream's task must call [`Stream::refresh`] before its next tick: a
    /// bucket's share to look at again as an epoch ends (`None`: at the ticks).
    pub fn wake_at(&self) -> Option<UnixMillis> {
        self.wake
    }

    /// Looks again at the buckets that are due at `now` ([`due`]): assignments whose share
    /// moved, whose TTL lapses before the next refresh, or that must end (a deny-all until
    /// room returns, a first grant held to its epoch); and abandons the buckets idle past
    /// `RLQS_ABANDON_AFTER`.
    pub fn refresh(&mut self, now: UnixMillis) -> Actions {
        let q = self.quotas.clone();
        self.follow_rules();
        let domain = self.domain.clone().unwrap_or_default();
        let idle_ms = u64::try_from(q.config.abandon_after.as_millis()).unwrap_or(u64::MAX);
        let idle = |t: &Tracked| now.0.saturating_sub(t.active_at.0) >= idle_ms;
        let mut actions = Actions::default();
        self.wake = None;
        for tracked in self.buckets.iter_mut() {
            if idle(tracked) {
                continue;
            }
            if let Some(look) = due(&q, &self.rules, tracked, now) {
                let a = assess(&q, &self.rules, &domain, tracked, look, now);
                offer(&q, tracked, a, now, &mut actions);
            }
            self.wake = earliest(self.wake, tracked.revisit);
        }
        let abandoned: Vec<Tracked> = self.buckets.extract_if(|t| idle(t)).collect();
        for mut t in abandoned {
            forget(&q, &mut t);
            q.stats.abandons.fetch_add(1, Ordering::Relaxed);
            actions.abandon(&t.id);
        }
        self.listed.set_buckets(self.buckets.len());
        actions
    }

    /// A bucket id's identity in the stream, as an entity's is its XXH3-128 (`rules/identity.rs`):
    /// per entry `u64 LE length ‖ key ‖ u64 LE length ‖ value` under the stream's seed, the
    /// entries' hashes added up (order-free, as a map is). Two ids that differ share one with odds
    /// of about 2^-128, against a seed the client cannot see.
    fn fingerprint(&mut self, bucket: &[(&str, &str)]) -> u128 {
        let mut sum = 0u128;
        for (k, v) in bucket {
            let b = &mut self.scratch;
            b.clear();
            b.extend_from_slice(&(k.len() as u64).to_le_bytes());
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            b.extend_from_slice(v.as_bytes());
            sum = sum.wrapping_add(xxh3_128_with_seed(b, self.seed));
        }
        sum
    }

    /// After a rules reload, every bucket is resolved again (its share moves with it).
    fn follow_rules(&mut self) {
        let now = self.quotas.limiter.rules();
        if Arc::ptr_eq(&now, &self.rules) {
            return;
        }
        self.rules = now;
        let q = self.quotas.clone();
        for t in self.buckets.iter_mut() {
            leave(&q, t);
            t.resolved = None;
        }
    }
}

/// Whether one more bucket, of an id of `id_bytes`, fits in the bounds, `tracked` being the
/// stream's buckets: if it does, counted in the service's buckets and id bytes (`forget`
/// takes both back); if not, counted in `refused` by the bound it does not fit in.
fn admit_bucket(q: &Quotas, tracked: usize, id_bytes: usize, refused: &mut Refused) -> bool {
    let bound = if tracked >= q.config.max_buckets_per_stream {
        &mut refused.per_stream
    } else if q.buckets.fetch_add(1, Ordering::Relaxed) >= q.config.max_buckets {
        q.buckets.fetch_sub(1, Ordering::Relaxed);
        &mut refused.buckets
    } else if q
        .id_bytes
        .fetch_add(id_bytes, Ordering::Relaxed)
        .saturating_add(id_bytes)
        > q.config.max_tracked_id_bytes
    {
        // Both fetch_adds above counted it: take them back.
        q.id_bytes.fetch_sub(id_bytes, Ordering::Relaxed);
        q.buckets.fetch_sub(1, Ordering::Relaxed);
        &mut refused.id_bytes
    } else {
        return true;
    };
    *bound += 1;
    q.stats.buckets_refused.fetch_add(1, Ordering::Relaxed);
    false
}

/// Takes a bucket out of its counter's shares.
fn leave(q: &Quotas, t: &mut Tracked) {
    if let (Some(seat), Some(Some((_, entity)))) = (t.seat.take(), t.resolved) {
        q.leave(entity, seat, t.member);
    }
}

/// Takes a bucket that goes out of its counter's shares and of the service's counts.
fn forget(q: &Quotas, t: &mut Tracked) {
    leave(q, t);
    q.buckets.fetch_sub(1, Ordering::Relaxed);
    q.id_bytes.fetch_sub(t.id.text_len(), Ordering::Relaxed);
}

impl Drop for Stream {
    fn drop(&mut self) {
        for t in self.buckets.iter_mut() {
            forget(&self.quotas, t);
        }
        self.quotas.streams.fetch_sub(1, Ordering::Relaxed);
        self.quotas.listing.close(self.id);
    }
}

/// The next chance to send after this one, with room for a late timer.
fn refresh_ms() -> u64 {
    2 * REFRESH.as_millis() as u64
}

/// How `tracked` is looked at: with a report's usage, or in a refresh, with the counter's
/// state if [`due`] has read it already at the same `now` (`Some(None)`: the rule counts
/// nothing, an `unlimited` one), so it is not read twice.
#[derive(Clone, Copy)]
enum Look {
    Report(Option<(Counts, Duration)>),
    Refresh(Option<Option<QuotaCount>>),
}

/// How a refresh looks at `tracked`'s share at `now`, if at all: not resolved yet (a
/// reload), its assignment lapsing before the next refresh (a deny-all until room returns
/// among them), its revisit due (a short window's first grant, as its epoch ends), moved by
/// another member's split, or its counter's room moved (the other replicas' usage
/// synced, or `ShouldRateLimit` hits): so a fleet that fills the room is sent `DENY_ALL`
/// within a refresh, not at each Envoy's next report. Reading the room is a table lookup;
/// the split it saves costs more.
fn due(q: &Quotas, rules: &Compiled, tracked: &mut Tracked, now: UnixMillis) -> Option<Look> {
    let Some((last, sent_at)) = tracked.last else {
        return Some(Look::Refresh(None));
    };
    let expires = sent_at.0.saturating_add(u64::from(last.ttl_s) * 1000);
    let revisit = tracked.revisit.is_some_and(|at| at <= now);
    match tracked.resolved {
        None => Some(Look::Refresh(None)),
        _ if revisit || expires <= now.0.saturating_add(refresh_ms()) => Some(Look::Refresh(None)),
        Some(Some((index, entity))) => {
            if tracked
                .seat
                .as_mut()
                .is_some_and(|s| q.moved(s, tracked.member))
            {
                return Some(Look::Refresh(None));
            }
            let count = q.limiter.count_quota(rules, index, entity, (0, 0), now);
            room_moved(tracked.room, count.map(|c| room_of(&c).now))
                .then_some(Look::Refresh(Some(count)))
        }
        Some(None) => None,
    }
}

/// The earlier of two optional instants.
fn earliest(a: Option<UnixMillis>, b: Option<UnixMillis>) -> Option<UnixMillis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether a counter's room went from `was` to `now` by enough to look at the shares again:
/// to or from none, or by more than [`ROOM_MOVED`] of the larger.
fn room_moved(was: Option<u64>, now: Option<u64>) -> bool {
    match (was, now) {
        (Some(a), Some(b)) => {
            (a == 0) != (b == 0) || a.abs_diff(b) as f64 > ROOM_MOVED * a.max(b) as f64
        }
        (a, b) => a.is_some() != b.is_some(),
    }
}

/// How far a counter's room moves before a refresh looks at its shares again.
const ROOM_MOVED: f64 = 1.0 / 8.0;

/// `tracked`'s assignment at `now`, and whether its counter's fleet demand is over the rate
/// (`replace::hold`): resolved if it was not, counted and observed with a report's usage,
/// or from the counter's state a refresh has read already.
fn assess(
    q: &Quotas,
    rules: &Compiled,
    domain: &str,
    tracked: &mut Tracked,
    look: Look,
    now: UnixMillis,
) -> Share {
    let resolved = match tracked.resolved {
        Some(r) => r,
        None => {
            let r = rules
                .rules
                .find_bucket(domain, tracked.id.entries())
                .map(|m| (m.index, m.entity));
            tracked.resolved = Some(r);
            r
        }
    };
    let unsplit = |strategy| Share {
        assignment: q.blanket(strategy),
        pressure: Pressure::Over,
        revisit: None,
    };
    tracked.revisit = None;
    let Some((index, entity)) = resolved else {
        return unsplit(q.config.unknown.for_domain(domain));
    };
    let (count, usage) = match look {
        Look::Refresh(Some(count)) => (count, None),
        Look::Refresh(None) => (
            q.limiter.count_quota(rules, index, entity, (0, 0), now),
            None,
        ),
        Look::Report(usage) => {
            let counts = usage.map_or((0, 0), |(c, _)| (c.allowed, c.denied));
            (
                q.limiter.count_quota(rules, index, entity, counts, now),
                usage,
            )
        }
    };
    match count {
        None => {
            tracked.room = None;
            unsplit(Strategy::AllowAll)
        }
        Some(count) => {
            tracked.room = Some(room_of(&count).now);
            let seat = (entity, &mut tracked.seat);
            let share = q.share(seat, tracked.member, &count, usage, now);
            tracked.revisit = share.revisit;
            share
        }
    }
}

/// Adds the action for `tracked`'s assignment `a` at `now` to `actions`, if it must go out
/// before the next refresh (the next chance to send): held to what Envoy runs where a change
/// is not worth a replacement (`replace::hold`, given whether the fleet's demand is over the
/// rate), then sent if it is news or a renewal is due.
fn offer(q: &Quotas, tracked: &mut Tracked, share: Share, now: UnixMillis, actions: &mut Actions) {
    let last = tracked.last.as_ref().map(|(last, _)| last);
    let a = hold(last, share.assignment, share.pressure);
    let last = tracked.last.as_ref().map(|(a, t)| (a, *t));
    if must_send(last, &a, now, refresh_ms()) {
        send(q, tracked, a, now, actions);
    }
}

/// Adds the action carrying `a` (or, when only its TTL is news, the settings Envoy runs: see
/// `to_send`) for `tracked` to `actions`, remembered as sent at `now`.
fn send(q: &Quotas, tracked: &mut Tracked, a: Assignment, now: UnixMillis, actions: &mut Actions) {
    let a = to_send(tracked.last.as_ref().map(|(last, _)| last), a);
    let replaced = tracked
        .last
        .is_none_or(|(last, _)| last.strategy != a.strategy);
    if let (true, Some(seat)) = (replaced, &tracked.seat) {
        q.granted(seat, tracked.member, &a, now);
    }
    tracked.last = Some((a, now));
    q.sent(&a);
    actions.assign(&tracked.id, &a);
}

// === impl Refused ===

impl Refused {
    /// Every bound's together.
    pub fn total(&self) -> u64 {
        self.per_stream + self.buckets + self.id_bytes
    }
}

/// The bounds that refused, by setting: `RLQS_MAX_BUCKETS: 3, ...`.
impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by = [
            ("RLQS_MAX_BUCKETS_PER_STREAM", self.per_stream),
            ("RLQS_MAX_BUCKETS", self.buckets),
            ("RLQS_MAX_TRACKED_ID_BYTES", self.id_bytes),
        ];
        let mut sep = "";
        for (setting, n) in by.into_iter().filter(|&(_, n)| n > 0) {
            write!(f, "{sep}{setting}: {n}")?;
            sep = ", ";
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
