//! The quota service's shared state ([`Quotas`]): every tracked (stream, bucket) as a member of
//! its counter's shares, the counter's state read from the limiter, and the assignment each
//! member gets; the bounds on streams and buckets; the counters of the service's metrics; and
//! the presence this replica publishes to the fleet (`global::PresenceSource`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::core::clock::UnixMillis;
use crate::core::limit::Algorithm;
use crate::global::Fleet;
use crate::rls::{QuotaCount, RateLimiter};

use super::config::Config;
use super::replace::{differs, Pressure};
use super::report::Counts;
use super::share::{
    assign_split, burst_fractions, catch_up, over_rate, pad_under_rate, pressed_floor, split,
    Assignment, Demand, Rest, Room, Strategy,
};

#[path = "young.rs"]
mod young;

/// How long one computation of a counter's assignments serves its members: each member's
/// refresh (every second) and report (every 5 s) would otherwise split the counter among all
/// its members again, O(members²) a second on a bucket many Envoys share.
const CACHE_MS: u64 = 250;

/// How far the room may move before a cached split is computed again regardless of its
/// age: a report that fills the room must turn the shares to deny-all at once.
const CACHE_ROOM: f64 = 1.0 / 16.0;

/// The quota service's state, shared by every stream (`stream.rs` holds each stream's own).
pub struct Quotas {
    pub(super) limiter: Arc<RateLimiter>,
    pub(super) config: Config,
    /// What the heartbeats say of the fleet (alone in local mode): how many replicas may be
    /// granting one counter's room.
    pub(super) fleet: Arc<Fleet>,
    /// Every counter with members on this replica: joining and leaving go through this map,
    /// a member's reports and refreshes through its [`Seat`] alone.
    counters: Mutex<HashMap<u128, Arc<Mutex<Shares>>>>,
    pub(super) streams: AtomicUsize,
    pub(super) buckets: AtomicUsize,
    /// The bytes of the tracked buckets' ids' keys and values, every stream together.
    pub(super) id_bytes: AtomicUsize,
    next_id: AtomicU64,
    /// The open streams' domains and bucket counts, for the status page.
    pub(super) listing: super::listing::Listing,
    /// The metrics' counters.
    pub stats: QuotaStats,
}

impl std::fmt::Debug for Quotas {
    /// Its counts only: the counters' shares are many and say nothing in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("streams", &self.stream_count())
            .field("buckets", &self.bucket_count())
            .finish_non_exhaustive()
    }
}

/// A member's place in its counter's shares: a report takes the shares' lock only, not the
/// map of every counter, and finds its member where it last was (the map, and a hash map
/// per member's state, once cost most of a report in cache misses).
pub(super) struct Seat {
    shares: Arc<Mutex<Shares>>,
    /// Where the member was in `Shares::members` (it moves only as others join or leave).
    at: usize,
}

/// The service's counters, read by the metrics at scrape time.
#[derive(Debug, Default)]
pub struct QuotaStats {
    /// Usage report messages taken.
    pub reports: AtomicU64,
    /// Streams ended with an error (a bad report, a bound).
    pub stream_errors: AtomicU64,
    /// Streams refused at the stream bound.
    pub streams_refused: AtomicU64,
    /// Bucket usages refused at a bucket bound (no assignment sent).
    pub buckets_refused: AtomicU64,
    /// Assignments sent: token bucket, deny-all, allow-all.
    pub token_bucket: AtomicU64,
    /// See `token_bucket`.
    pub deny_all: AtomicU64,
    /// See `token_bucket`.
    pub allow_all: AtomicU64,
    /// Abandon actions sent.
    pub abandons: AtomicU64,
}

/// One counter's members on this replica, what the rest of the fleet has on it, and the
/// latest split.
#[derive(Default)]
struct Shares {
    /// By id, ascending (a split's order): a new member's id is the newest, so it goes last.
    members: Vec<Member>,
    rest: Rest,
    /// When the latest split was made, on what room; each member's part is its `assigned`.
    /// Kept when it goes stale: the next is compared with it.
    cache: Option<Cache>,
    /// A member joined or left, or the rest of the fleet moved: the split is computed again.
    stale: bool,
    /// Whether the presence exchange has told what the rest of the fleet has (`rest`).
    rest_known: bool,
    /// The limit's steady rate at the latest split (0 before one): what a member without a
    /// rate yet is published at, its prior share of it.
    rate: f64,
}

/// A (stream, bucket) sharing the counter.
struct Member {
    id: u64,
    demand: Demand,
    /// The tokens at once its Envoy was last handed (a new bucket's capacity) and how many
    /// it reported admitted since: what it may still take at once, which the room's count
    /// does not know yet.
    grant: Option<Grant>,
    /// Its part of the latest split.
    assigned: Option<Assignment>,
    /// A later split moved its assignment, for its stream's next refresh.
    moved: bool,
    /// On a short window: when the epoch of its first report ends. Until then it keeps its
    /// first grant, held to its part of that epoch's room (`young.rs`).
    cold_until: Option<UnixMillis>,
}

/// The token bucket a member's Envoy runs, as sent.
#[derive(Debug, Clone, Copy)]
struct Grant {
    /// Its capacity: what it started with, if new.
    tokens: u64,
    /// Admitted requests reported since it was sent.
    used: u64,
    /// Tokens a second it refills at.
    rate: f64,
    /// When it was sent.
    at: UnixMillis,
}

/// A member's assignment, as [`Quotas::share`] gives it to its stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct Share {
    pub(super) assignment: Assignment,
    /// What it was computed under (`replace::hold`).
    pub(super) pressure: Pressure,
    /// When the stream must look at it again whatever else happens: the end of the epoch its
    /// first grant is held to (`young.rs`).
    pub(super) revisit: Option<UnixMillis>,
}

/// One split of a counter among this replica's members: each member's assignment, in the
/// members' order, and whether the fleet's demand was over the rate.
struct Split {
    assigned: Vec<Assignment>,
    pressed: bool,
}

/// What a split knows of each member, in the members' order.
struct Parts<'a> {
    young: &'a [bool],
    demands: &'a [Option<f64>],
    fractions: &'a [f64],
    burst: &'a [f64],
    /// The fleet's demand is over the rate (`share::over_rate`).
    pressed: bool,
}

struct Cache {
    at: UnixMillis,
    room: u64,
    /// Whether the fleet's demand was over the rate (`share::over_rate`).
    pressed: bool,
    /// When the first members' epoch held to their first grants ends (`young.rs`): the
    /// split no longer holds then, whatever the room.
    until: Option<UnixMillis>,
}

// === impl Quotas ===

impl Quotas {
    /// The service's state over `limiter`, within `config`'s bounds, in `fleet` (the one the
    /// wiring built, alone in local mode).
    pub fn new(limiter: Arc<RateLimiter>, config: Config, fleet: Arc<Fleet>) -> Arc<Quotas> {
        Arc::new(Quotas {
            limiter,
            config,
            fleet,
            counters: Mutex::new(HashMap::new()),
            streams: AtomicUsize::new(0),
            buckets: AtomicUsize::new(0),
            id_bytes: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            listing: super::listing::Listing::default(),
            stats: QuotaStats::default(),
        })
    }

    /// Open streams.
    pub fn stream_count(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Tracked (stream, bucket) pairs, every stream together.
    pub fn bucket_count(&self) -> usize {
        self.buckets.load(Ordering::Relaxed)
    }

    /// The bytes of the tracked buckets' ids' keys and values, every stream together.
    pub fn id_bytes(&self) -> usize {
        self.id_bytes.load(Ordering::Relaxed)
    }

    /// Counters with members on this replica.
    pub fn counter_count(&self) -> usize {
        self.counters.lock().len()
    }

    /// The first `max` open streams (oldest first) with their domains and bucket counts,
    /// and how many more are open.
    pub fn streams_listed(&self, max: usize) -> (Vec<super::listing::StreamSummary>, usize) {
        self.listing.list(max)
    }

    /// Its bounds.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The rules limiter the usage is counted in.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes `member` one of `entity`'s sharers: its seat. Under the map's lock, so a
    /// counter is never dropped by its last member's leaving while another joins it.
    fn join(&self, entity: u128, member: u64) -> Seat {
        let mut counters = self.counters.lock();
        let seat = counters.entry(entity).or_default().clone();
        let mut shares = seat.lock();
        let at = match shares.find(member, 0) {
            Ok(at) => at,
            Err(at) => {
                shares.members.insert(
                    at,
                    Member {
                        id: member,
                        demand: Demand::default(),
                        grant: None,
                        assigned: None,
                        moved: false,
                        cold_until: None,
                    },
                );
                shares.stale = true;
                at
            }
        };
        drop(shares);
        Seat { shares: seat, at }
    }

    /// Takes `member` out of `entity`'s sharers (`seat`); the counter goes with its last
    /// member.
    pub(super) fn leave(&self, entity: u128, seat: Seat, member: u64) {
        let mut counters = self.counters.lock();
        let mut shares = seat.shares.lock();
        if let Ok(at) = shares.find(member, seat.at) {
            shares.members.remove(at);
            shares.stale = true;
        }
        let ours = |s: &Arc<Mutex<Shares>>| Arc::ptr_eq(s, &seat.shares);
        if shares.members.is_empty() && counters.get(&entity).is_some_and(ours) {
            counters.remove(&entity);
        }
    }

    /// Whether a split since `member`'s last look moved its assignment (and forgets it).
    pub(super) fn moved(&self, seat: &mut Seat, member: u64) -> bool {
        let mut shares = seat.shares.lock();
        let Ok(at) = shares.find(member, seat.at) else {
            return false;
        };
        seat.at = at;
        std::mem::take(&mut shares.members[at].moved)
    }

    /// The assignment of `member` of `entity` (made one of its sharers, its `seat`, if it is
    /// not yet) given the counter's state `count`, after its report of `usage` (counts over
    /// the elapsed time) if any: with what it was computed under (`replace::hold`; `Over`
    /// where there is no split) and when the stream must look at it again.
    pub(super) fn share(
        &self,
        (entity, seat): (u128, &mut Option<Seat>),
        member: u64,
        count: &QuotaCount,
        usage: Option<(Counts, Duration)>,
        now: UnixMillis,
    ) -> Share {
        if count.allow_all {
            return self.unsplit(Strategy::AllowAll);
        }
        let room = room_of(count);
        let seat = seat.get_or_insert_with(|| self.join(entity, member));
        let mut guard = seat.shares.lock();
        let shares = &mut *guard;
        let Ok(me) = shares.find(member, seat.at) else {
            // Not reached: a stream holds a seat only while its member sits in it (it leaves
            // and drops the seat together).
            return self.unsplit(Strategy::DenyAll);
        };
        seat.at = me;
        let m = &mut shares.members[me];
        if let Some((counts, elapsed)) = usage {
            m.demand.observe(counts, elapsed, now);
            if let Some(g) = &mut m.grant {
                g.used = g.used.saturating_add(counts.allowed);
            }
        }
        if m.assigned.is_none() {
            m.cold_until = young::cold_until(&room, now);
        }
        let revisit = m.cold_until.filter(|&end| now < end);
        // A prior's rate is what holds a short limit's fleet (`replace::Pressure::Prior`); a
        // longer limit's room holds it, and turns it to `DenyAll` once spent.
        let prior = room.short && m.demand.rate(now).is_none();
        let share = |a: Option<Assignment>, pressed: bool| Share {
            assignment: a.unwrap_or_else(|| self.blanket(Strategy::DenyAll)),
            pressure: match (pressed, prior) {
                (true, _) => Pressure::Over,
                (false, true) => Pressure::Prior,
                (false, false) => Pressure::Under,
            },
            revisit,
        };
        if let Some((a, pressed)) = shares.cached(me, room.now, now) {
            return share(Some(a), pressed);
        }
        let Split { assigned, pressed } = self.split_room(shares, room, now);
        // The other members whose share this split moved are sent theirs at their stream's
        // next refresh; the others' streams have nothing to look at.
        for (i, (m, a)) in shares.members.iter_mut().zip(assigned).enumerate() {
            if i != me && m.assigned.is_none_or(|w| differs(&w.strategy, &a.strategy)) {
                m.moved = true;
            }
            m.assigned = Some(a);
        }
        shares.stale = false;
        shares.rate = room.rate;
        let until = shares
            .members
            .iter()
            .filter_map(|m| m.cold_until.filter(|&end| now < end))
            .min();
        shares.cache = Some(Cache {
            at: now,
            room: room.now,
            pressed,
            until,
        });
        share(shares.members[me].assigned, pressed)
    }

    /// A blanket rule where there is no split to make.
    fn unsplit(&self, strategy: Strategy) -> Share {
        Share {
            assignment: self.blanket(strategy),
            pressure: Pressure::Over,
            revisit: None,
        }
    }

    /// The split of `room` among `shares`' members at `now`.
    fn split_room(&self, shares: &Shares, room: Room, now: UnixMillis) -> Split {
        let ttl = self.config.assignment_ttl;
        let members = &shares.members;
        let demands: Vec<Option<f64>> = members.iter().map(|m| m.demand.rate(now)).collect();
        let young: Vec<bool> = members.iter().map(|m| m.demand.young()).collect();
        // Settled streams also get the room their buckets left unused back as rate
        // (`share::catch_up`); young ones' grants are what must stay cautious.
        let room = if young.contains(&true) {
            room
        } else {
            catch_up(&room)
        };
        let rest = self.rest(shares, &demands, room.rate);
        let fractions = split(room.rate, &demands, rest);
        let pressed = over_rate(room.rate, &demands, rest);
        let fleet_streams = (members.len() as u64).saturating_add(rest.streams);
        let burst = burst_fractions(&fractions, fleet_streams);
        let floors: Vec<u64> = if pressed && !room.short {
            members.iter().map(|m| pressed_floor(m.assigned)).collect()
        } else {
            Vec::new()
        };
        let mut assigned = assign_split(&room, &fractions, &burst, ttl, &floors);
        if !pressed {
            pad_under_rate(&room, &fractions, &mut assigned);
        }
        if young.contains(&true) {
            let parts = Parts {
                young: &young,
                demands: &demands,
                fractions: &fractions,
                burst: &burst,
                pressed,
            };
            self.cap_young(shares, &room, &parts, &mut assigned);
            self.cap_cold(shares, &room, &parts, &mut assigned, now);
        }
        Split { assigned, pressed }
    }

    /// What the split takes the rest of the fleet to have on the counter: what the presence
    /// exchange told, or, until it has, as much as this replica has at each of the other live
    /// replicas (each may be serving its own Envoys the same rate: two replicas that each
    /// handed their one Envoy the whole rate admitted 1.5× a per-second bucket until the
    /// exchange met).
    fn rest(&self, shares: &Shares, demands: &[Option<f64>], rate: f64) -> Rest {
        if shares.rest_known {
            return shares.rest;
        }
        let live = u64::from(self.fleet.live_replicas().max(1));
        let streams = live.saturating_mul(demands.len() as u64).max(1);
        // A member without a rate yet wants its prior, as `split` takes it.
        let prior = rate / streams as f64;
        let demand: f64 = demands.iter().map(|d| d.unwrap_or(prior)).sum();
        Rest {
            streams: (live - 1).saturating_mul(demands.len() as u64),
            demand: (live - 1) as f64 * demand,
        }
    }

    /// `member`'s Envoy (in `seat`) runs `a` from `now`, a new bucket (not the same settings
    /// renewed): what it may take at once starts again from `a`'s capacity.
    pub(super) fn granted(&self, seat: &Seat, member: u64, a: &Assignment, now: UnixMillis) {
        let mut shares = seat.shares.lock();
        let Ok(at) = shares.find(member, seat.at) else {
            return;
        };
        shares.members[at].grant = match a.strategy {
            Strategy::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_s,
            } => Some(Grant {
                tokens: u64::from(max_tokens),
                used: 0,
                rate: f64::from(tokens_per_fill) / f64::from(fill_interval_s.max(1)),
                at: now,
            }),
            _ => None,
        };
    }

    /// A blanket rule lasting the configured TTL.
    pub(super) fn blanket(&self, strategy: Strategy) -> Assignment {
        Assignment {
            strategy,
            ttl_s: super::share::whole_secs(self.config.assignment_ttl),
        }
    }

    /// Counts an assignment sent, by kind.
    pub(super) fn sent(&self, a: &Assignment) {
        let counter = match a.strategy {
            Strategy::TokenBucket { .. } => &self.stats.token_bucket,
            Strategy::DenyAll => &self.stats.deny_all,
            Strategy::AllowAll => &self.stats.allow_all,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// This replica's counters with members: how many, and their demand together (requests a
    /// second; a member without a rate yet at its prior, an even share of the limit's rate
    /// among the streams known: the other replicas split the rate as if it wanted that, as
    /// this one does, instead of handing their own streams the whole rate until its first
    /// report).
    pub fn presence(&self, now: UnixMillis) -> Vec<(u128, u32, f64)> {
        let counters = self.counters.lock();
        counters
            .iter()
            .map(|(&entity, seat)| {
                let s = seat.lock();
                let known = (s.members.len() as u64)
                    .saturating_add(s.rest.streams)
                    .max(1);
                let prior = s.rate / known as f64;
                let demand = s
                    .members
                    .iter()
                    .map(|m| m.demand.rate(now).unwrap_or(prior))
                    .sum();
                let streams = u32::try_from(s.members.len()).unwrap_or(u32::MAX);
                (entity, streams, demand)
            })
            .collect()
    }

    /// What the rest of the fleet has on each counter, as the presence exchange read it.
    pub fn set_rest(&self, others: &[(u128, Rest)]) {
        let counters = self.counters.lock();
        for (entity, rest) in others {
            if let Some(seat) = counters.get(entity) {
                let mut shares = seat.lock();
                let first = !std::mem::replace(&mut shares.rest_known, true);
                if first || shares.rest != *rest {
                    shares.rest = *rest;
                    shares.stale = true;
                }
                if first {
                    // The first word of the others: each member's stream looks again at its
                    // next refresh (a second), not at its Envoy's next report (5 s). Later
                    // changes wait for the reports, as each move replaces Envoy's bucket.
                    for m in &mut shares.members {
                        m.moved = true;
                    }
                }
            }
        }
    }
}

// === impl Shares ===

impl Shares {
    /// Where `member` is among the members (looked for first at `hint`), or would go.
    fn find(&self, member: u64, hint: usize) -> Result<usize, usize> {
        if self.members.get(hint).is_some_and(|m| m.id == member) {
            return Ok(hint);
        }
        self.members.binary_search_by_key(&member, |m| m.id)
    }

    /// The assignment of the member at `me` in the cached split and whether the fleet's
    /// demand was over the rate then, if that split is recent and on about this room.
    fn cached(&self, me: usize, room: u64, now: UnixMillis) -> Option<(Assignment, bool)> {
        let cache = self.cache.as_ref().filter(|_| !self.stale)?;
        if now.0 >= cache.at.0.saturating_add(CACHE_MS)
            || now.0 < cache.at.0
            || cache.until.is_some_and(|until| now >= until)
        {
            return None;
        }
        let moved = cache.room.abs_diff(room) as f64 > CACHE_ROOM * cache.room.max(room) as f64;
        if (cache.room == 0) != (room == 0) || moved {
            return None;
        }
        Some((self.members[me].assigned?, cache.pressed))
    }
}

// === impl Member ===

impl Member {
    /// What its Envoy may still take at once from its last grant, by what it reported.
    fn outstanding(&self) -> u64 {
        self.grant.map_or(0, |g| g.tokens.saturating_sub(g.used))
    }
}

/// The room a counter's state leaves the fleet: a bucket's tokens, or a window's limit less
/// its count.
pub(super) fn room_of(count: &QuotaCount) -> Room {
    let limit = &count.limit;
    let v = &count.verdict;
    match limit.algorithm {
        Algorithm::TokenBucket { .. } => Room::bucket(limit, v.count_after),
        _ => Room::window(limit, v.count_after, count.prev, v.reset_ms),
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
