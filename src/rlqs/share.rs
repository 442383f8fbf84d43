//! The pure arithmetic of sharing one limit among Envoy streams: each (stream, bucket)'s
//! demand estimate ([`Demand`]), each stream's fraction of the room the fleet may use
//! ([`split`]; the room itself, [`Room`], is `room.rs`'s), and the assignment Envoy gets
//! ([`assign`], [`Assignment`]). No I/O, no clock read: `now` is always an argument.
//!
//! Designed for what Envoy 1.40 does, not for the documentation: it reports every 5 s
//! whatever `reporting_interval` says; a new bucket's first report has `time_elapsed` = 0;
//! it reads `fill_interval` and `assignment_time_to_live` in whole seconds (a fill interval
//! under 1 s becomes 0, an unlimited rate; a TTL under 1 s expires at once and the bucket
//! falls back to allow-all), so neither is ever emitted under 1 s here.

use std::time::Duration;

use crate::core::clock::UnixMillis;

use super::report::Counts;

pub use super::assignment::{strategy_proto, whole_secs, Assignment, Strategy};
pub use super::room::{catch_up, Room, CATCH_UP_S};

/// The longest `fill_interval` emitted, in seconds. A share slower than one token per this
/// long is no share: the stream is denied until its next assignment instead.
pub const MAX_FILL_INTERVAL_S: u32 = 3600;

/// The longest fill interval tried to express a rate of one token per second or more more
/// precisely (`tokens_per_fill` / `fill_interval` rounds the rate down; Envoy refills
/// continuously, so a longer interval is no coarser in time): a tenth of a token a second.
///
/// Why not Envoy's 5 s reporting interval, as before: fifty Envoys on a per-second limit
/// hold shares of about a token a second, and 0.99 a second went out as 4 every 5 s (0.8):
/// fifty Envoys under a per-second bucket admitted 0.93× what they were offered (0.94× now)
/// and 0.86× a per-minute window at twice the limit at 5 s reports (0.91×). Longer
/// intervals gain little more, and a finer rate lets shares a little apart stay apart
/// (`replace::differs` holds moves under an eighth): ten Envoys on a per-minute window were
/// 17.6 % apart at 20 s (over three seeds; 13.5 % at 10 s).
const MAX_PRECISION_FILL_S: u32 = 10;

/// How many seconds of its rate a short bucket's stream holds at once at least while the
/// fleet's demand fits in the rate ([`pad_under_rate`]).
const UNDER_RATE_CAPACITY_S: f64 = 1.2;

/// The requests a demand estimate is read from at least, when the latest reports have them
/// ([`Demand`]).
const POOL_REQUESTS: u64 = 8;

/// The most reports a demand estimate pools ([`Demand`]).
const SAMPLES: usize = 4;

/// A [`short`](Room::short) limit's stream holds at least this many tokens at once.
///
/// Why: a share of one token a second in a bucket of one turns down the second of two
/// requests that arrive within a second, although the fleet's bucket (a second of the
/// limit's rate) would take both; requests arrive by chance, so a bucket of one admits about
/// 0.86× its rate at twice its rate. The capacities of many small shares together then pass
/// the limit's burst, by up to this many tokens a stream: a fleet idle long enough to fill
/// them all may admit that much more at once, within the period of ten fill times the
/// accuracy is measured over (fifty Envoys on a 50/s bucket: 0.64× an exact bucket admitted
/// at twice the limit with a bucket of one each, 0.95× with three).
const MIN_SHORT_TOKENS: u64 = 3;

/// A stream on a longer limit that runs a token bucket holds at least this many tokens at
/// once while the fleet's demand is over the rate and it is not past the limit; one that
/// does not yet, a token ([`pressed_floor`]).
///
/// Why: near its limit a window's room, split among many streams and rounded down, is a
/// token or none each: a stream with none was denied until its next assignment, one with a
/// bucket of one took about half its rate (the refill that finds it full is lost), and the
/// count settled below the limit with room no stream could take (fifty Envoys at twice 600
/// a minute: 0.85× the exact limiter at 1 s reports, 0.98× with this). A pressed stream's
/// bucket is near empty, so the capacities pass the room only once demand falls. A bucket
/// after a deny starts full: three tokens there were a gift at each deny's end, and two
/// Envoys on an hour's limit drew 13–18 % apart.
const MIN_PRESSED_TOKENS: u64 = 3;

/// A demand larger than this (requests per second) is taken as this: a client's counts go up
/// to `u64::MAX`, and an infinite demand would make the split's sums `NaN`.
const MAX_DEMAND: f64 = 1e15;

/// One (stream, bucket)'s demand estimate, from its successive reports.
///
/// The estimate is the latest report's rate when it counted at least [`POOL_REQUESTS`]
/// requests; otherwise the rate over the latest reports together (up to [`SAMPLES`]) from
/// the newest back until they hold that many. A busy stream is followed at its first busy
/// report, and a stream whose latest reports hold under a quarter of what an older one's
/// rate predicts for them (at least [`POOL_REQUESTS`]) is read from the latest alone: a busy
/// stream gone idle reads zero at its first idle report. A stream that stops reporting the
/// bucket (Envoy reports every bucket every interval) counts as idle once two of its
/// intervals have passed.
///
/// Why pooled: a stream of a request or two a report (fifty Envoys on a per-second limit) has
/// a rate that one report reads as 0, 1 or 3 a second by chance. Estimates that swing so move
/// its share at almost every report, each move replaces Envoy's running bucket (dropping the
/// fraction of a token being refilled), and a stream read as idle is given nothing: fifty
/// Envoys under a per-second limit had 48 % of their requests admitted on estimates of one
/// or two reports, 93 % pooled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// The latest reports with a rate, newest first.
    samples: [Option<Sample>; SAMPLES],
    /// When the latest report (with or without a rate) arrived.
    last_at: Option<UnixMillis>,
}

/// The requests of one report over its `time_elapsed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    requests: u64,
    elapsed_ms: u64,
}

// === impl Demand ===

impl Demand {
    /// Takes one report of the bucket: `counts` over `elapsed`, arrived at `now`. A report with
    /// `elapsed` zero (a new bucket's first) gives no rate: it only marks the stream as seen.
    pub fn observe(&mut self, counts: Counts, elapsed: Duration, now: UnixMillis) {
        self.last_at = Some(now);
        // Whole milliseconds: a sub-millisecond `elapsed` is no interval to take a rate over.
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if elapsed_ms == 0 {
            return;
        }
        self.samples.rotate_right(1);
        self.samples[0] = Some(Sample {
            requests: counts.demand(),
            elapsed_ms,
        });
    }

    /// Whether fewer than two reports with a rate came: the stream's share is still settling
    /// (its first rate may be a burst's), so its grants are held to the room the others'
    /// grants leave (`engine.rs`).
    pub fn young(&self) -> bool {
        self.samples[1].is_none()
    }

    /// The demand in requests per second at `now`; `None` until a report with a rate came.
    pub fn rate(&self, now: UnixMillis) -> Option<f64> {
        let latest = self.samples[0]?;
        let last_at = self.last_at?;
        if now.0.saturating_sub(last_at.0) > latest.elapsed_ms.saturating_mul(2) {
            return Some(0.0);
        }
        let (mut requests, mut elapsed_ms) = (0u64, 0u64);
        for sample in self.samples.iter().flatten() {
            // An older report whose rate says the newer ones should have held many more
            // requests than they did is from before the demand fell: not pooled.
            let expected = (u128::from(sample.requests) * u128::from(elapsed_ms))
                / u128::from(sample.elapsed_ms.max(1));
            if expected >= u128::from(POOL_REQUESTS) && u128::from(requests) * 4 < expected {
                break;
            }
            requests = requests.saturating_add(sample.requests);
            elapsed_ms = elapsed_ms.saturating_add(sample.elapsed_ms);
            if requests >= POOL_REQUESTS {
                break;
            }
        }
        Some(per_second(requests, elapsed_ms))
    }
}

/// `requests` over `elapsed_ms` (> 0) as requests per second, at most [`MAX_DEMAND`].
fn per_second(requests: u64, elapsed_ms: u64) -> f64 {
    (requests as f64 * 1000.0 / elapsed_ms as f64).min(MAX_DEMAND)
}

/// What this replica knows of the rest of the fleet on one bucket: the other replicas'
/// streams (through the sync) and their total demand.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rest {
    /// The other replicas' streams on the bucket.
    pub streams: u64,
    /// Their total demand, in requests per second. A stream there without a rate yet counts
    /// at its prior (the limit's rate over the streams known) if its replica says so, else as
    /// nothing: then this replica's views of the fleet, taken together, may give out up to
    /// that prior more than the rate until the new stream's first rated report.
    pub demand: f64,
}

/// Each of this replica's streams' fraction of the fleet's [`Room`] (of its rate and of its
/// tokens at once), given their demands (`None`: no rate yet) and the rest of the fleet's.
///
/// A stream with no rate yet is taken to want an even share of the rate among every stream
/// known (its prior). When the fleet's demand fits in the rate, each stream gets its demand
/// or a floor, whichever is more, the floor set so that they add up to the rate
/// ([`floor_level`]): a stream whose demand grows has room before its next report, and a
/// quiet stream read low by chance keeps an even share; when it does not fit, the rate is
/// shared max-min fairly ([`water_level`]):
/// each stream gets its demand up to a level, the same for every stream that wants more, so an
/// idle stream's share goes to the busy ones and busy streams get equal shares. The fractions of every stream of the fleet sum
/// to at most 1, so this replica's never hand out more than the room.
pub fn split(rate: f64, demands: &[Option<f64>], rest: Rest) -> Vec<f64> {
    let streams = (demands.len() as f64) + rest.streams as f64;
    if rate.is_nan() || rate <= 0.0 || demands.is_empty() {
        return vec![0.0; demands.len()];
    }
    let prior = rate / streams;
    let wanted: Vec<f64> = demands.iter().map(|d| d.map_or(prior, sanitize)).collect();
    let total = wanted.iter().sum::<f64>() + sanitize(rest.demand);
    if total > rate {
        let level = water_level(rate, &wanted, rest);
        return wanted
            .into_iter()
            .map(|d| (d.min(level) / rate).clamp(0.0, 1.0))
            .collect();
    }
    let floor = floor_level(rate, &wanted, rest);
    wanted
        .into_iter()
        .map(|d| (d.max(floor) / rate).clamp(0.0, 1.0))
        .collect()
}

/// The level that shares `rate` among demands under it: each stream gets its demand or the
/// level, whichever is more, and the level is where they add up to the rate. The rest of the
/// fleet counts as in [`water_level`].
///
/// Why not each stream's demand plus an even part of what is left: a quiet stream's
/// estimate of a request or two a report reads 0 as often as not, and such a stream then got
/// a sliver of the rate, less than its demand: fifty Envoys under a per-second limit had one
/// in five of their requests denied.
fn floor_level(rate: f64, wanted: &[f64], rest: Rest) -> f64 {
    let demands = by_demand(wanted, rest);
    let mut above: f64 = demands.iter().map(|&(d, n)| d * n).sum();
    let mut below = 0.0;
    for (i, &(d, n)) in demands.iter().enumerate() {
        // The streams up to this one get the level, the ones after it their demand.
        above -= d * n;
        below += n;
        let level = (rate - above) / below;
        if demands.get(i + 1).is_none_or(|&(next, _)| level <= next) {
            return level.max(0.0);
        }
    }
    0.0
}

/// The demands as (demand a stream, streams), lowest first: each of `wanted` one stream, and
/// the rest of the fleet `rest.streams` streams of an even part of its demand.
fn by_demand(wanted: &[f64], rest: Rest) -> Vec<(f64, f64)> {
    let mut demands: Vec<(f64, f64)> = wanted.iter().map(|&d| (d, 1.0)).collect();
    let rest_demand = sanitize(rest.demand);
    if rest.streams > 0 || rest_demand > 0.0 {
        let n = rest.streams.max(1) as f64;
        demands.push((rest_demand / n, n));
    }
    demands.sort_by(|a, b| a.0.total_cmp(&b.0));
    demands
}

/// The level that shares `rate` among demands over it, max-min fairly: each stream gets its
/// demand up to the level, and the level is where they add up to the rate. The rest of the
/// fleet counts as `rest.streams` streams of an even part of its demand each.
///
/// Why not in proportion to demand: a busy stream's estimate is a few requests a report and
/// swings by a third from one report to the next, and a share in proportion to it swings
/// with it; each swing replaces Envoy's running bucket and rounds its level down, which cost
/// ten Envoys on a per-second bucket a tenth of the rate. Under max-min, every stream that
/// wants more than the level gets the level, however much more it wants, so the shares of
/// streams of equal demand stay equal and still.
fn water_level(rate: f64, wanted: &[f64], rest: Rest) -> f64 {
    let demands = by_demand(wanted, rest);
    let (mut left, mut streams) = (rate, demands.iter().map(|d| d.1).sum::<f64>());
    for &(d, n) in &demands {
        if d * streams >= left {
            return left / streams;
        }
        left -= d * n;
        streams -= n;
    }
    f64::INFINITY
}

/// Whether the fleet's demand (this replica's streams', `None` at their prior as in
/// [`split`], and the rest of the fleet's) is over `rate`: then [`split`] divides the rate by
/// demand and every stream's share is the room's guard; under it, each stream has more than
/// its demand. No rate, or no stream: over.
pub fn over_rate(rate: f64, demands: &[Option<f64>], rest: Rest) -> bool {
    if rate.is_nan() || rate <= 0.0 || demands.is_empty() {
        return true;
    }
    let prior = rate / ((demands.len() as f64) + rest.streams as f64);
    let wanted: f64 = demands.iter().map(|d| d.map_or(prior, sanitize)).sum();
    wanted + sanitize(rest.demand) > rate
}

/// A demand as the split takes it: finite, between 0 and [`MAX_DEMAND`].
fn sanitize(demand: f64) -> f64 {
    if demand > 0.0 {
        demand.min(MAX_DEMAND)
    } else {
        0.0
    }
}

/// The assignment for a stream with `fraction` of the fleet's `room`, lasting `ttl`: its
/// tokens at once are `fraction` of the room's, rounded down (see [`assign_all`] for this
/// replica's streams together, which hands out what the rounding leaves).
///
/// Every rounding goes down, so a stream never gets more than `fraction` of the room's rate
/// nor of its tokens at once. No room left: `DenyAll` until room returns (`room.until_ms`,
/// rounded up: a deny that ended early would fall back to allow-all before the next
/// assignment). A share that rounds to no token, or to less than one token per
/// [`MAX_FILL_INTERVAL_S`]: `DenyAll` for `ttl`, until the next assignment.
pub fn assign(room: &Room, fraction: f64, ttl: Duration) -> Assignment {
    let fraction = clamp_fraction(fraction);
    let max_tokens = (room.now as f64 * fraction).floor();
    with_tokens(room, fraction, max_tokens as u64, ttl)
}

/// The assignments of this replica's streams, with `fractions` of the fleet's `room` (from
/// [`split`]), lasting `ttl`: as [`assign`], but the tokens at once that rounding each share
/// down leaves go one each to the streams with the largest remainders (the first of equals),
/// as long as the sum stays within the streams' fractions of the room together. So a room
/// of a few tokens among many streams admits those few instead of denying every stream.
pub fn assign_all(room: &Room, fractions: &[f64], ttl: Duration) -> Vec<Assignment> {
    assign_split(room, fractions, fractions, ttl, &[])
}

/// As [`assign_all`], with each stream's rate from `fractions` and its tokens at once from
/// `burst` (its fraction of the room's tokens; see [`burst_fractions`]); a longer limit's
/// stream with a rate gets at least its `floors` entry ([`pressed_floor`]) unless the fleet
/// must be denied ([`Room::exhausted`]).
pub fn assign_split(
    room: &Room,
    fractions: &[f64],
    burst: &[f64],
    ttl: Duration,
    floors: &[u64],
) -> Vec<Assignment> {
    let burst: Vec<f64> = burst.iter().map(|&f| clamp_fraction(f)).collect();
    let exact: Vec<f64> = burst.iter().map(|f| room.now as f64 * f).collect();
    let mut tokens: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    // The epsilon forgives the sum's float error (ten fractions of 0.1 sum to 0.999…), at
    // the cost of at most a billionth of a token.
    let together = (room.now as f64 * burst.iter().sum::<f64>().min(1.0) + 1e-9).floor() as u64;
    let left = together
        .min(room.now)
        .saturating_sub(tokens.iter().sum::<u64>());
    let mut order: Vec<usize> = (0..exact.len()).collect();
    // Largest remainder first; `sort_by` is stable, so the first of equals leads.
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for &i in order
        .iter()
        .take(usize::try_from(left).unwrap_or(usize::MAX))
    {
        tokens[i] += 1;
    }
    fractions
        .iter()
        .zip(tokens)
        .enumerate()
        .map(|(i, (&f, t))| {
            let f = clamp_fraction(f);
            // A short limit's stream holds at least a second of its rate (see `with_tokens`),
            // and at least `MIN_SHORT_TOKENS`.
            let t = if room.short {
                t.max((room.rate * f).floor() as u64).max(MIN_SHORT_TOKENS)
            } else if f > 0.0 && !room.exhausted() {
                t.max(floors.get(i).copied().unwrap_or(0))
            } else {
                t
            };
            with_tokens(room, f, t, ttl)
        })
        .collect()
}

/// Each stream's fraction of the room's tokens at once, from its fraction of the rate
/// (`fractions`, from [`split`]) among `streams` in the fleet: half in proportion to the
/// rate's, half evenly. They sum to at most 1 as the rate's do.
///
/// Why: a stream's rate follows demand estimates that swing with a few requests a report,
/// and a busy stream's swings move every quiet one's share of what is left. A capacity
/// following them shrinks a quiet stream's bucket to a few tokens (each replacement carries
/// its level in proportion) and a burst of three requests is then denied under the limit; an
/// even half keeps every stream a burst's worth of the room whatever the busy one's estimate.
pub fn burst_fractions(fractions: &[f64], streams: u64) -> Vec<f64> {
    let even = 1.0 / streams.max(fractions.len() as u64).max(1) as f64;
    fractions
        .iter()
        .map(|&f| (clamp_fraction(f) + even) / 2.0)
        .collect()
}

/// `assigned` (from [`assign_split`], with `fractions` of `room`'s rate) with each token
/// bucket's capacity raised to [`UNDER_RATE_CAPACITY_S`] of its rate, on a
/// [`short`](Room::short) token-bucket limit whose fleet demand fits in the rate (`split`'s
/// floor shares): the capacities together pass the burst by a fifth.
///
/// Why: requests fall on the Envoys by chance, and a bucket of one second of its share
/// turns down a burst the fleet's bucket, pooling every Envoy's, would take: ten Envoys at
/// 0.8× a 50/s bucket were falsely denied 2.8 % of their requests, 2.2 % with this. A fleet
/// whose demand then surges takes the extra fifth of the burst once, within the period of
/// ten fill times the accuracy is measured over (docs/accuracy.md, *Surges after a quiet
/// spell*: ten Envoys 1.04× as the surge begins). Not on a window, whose streams'
/// capacities already make a surge admit up to twice its limit in a second; and fifty
/// streams' [`MIN_SHORT_TOKENS`] already pass 1.2 s of their shares.
pub fn pad_under_rate(room: &Room, fractions: &[f64], assigned: &mut [Assignment]) {
    if !room.short || room.epoch.is_some() {
        return;
    }
    for (a, &f) in assigned.iter_mut().zip(fractions) {
        if let Strategy::TokenBucket { max_tokens, .. } = &mut a.strategy {
            let padded = (UNDER_RATE_CAPACITY_S * room.rate * clamp_fraction(f)).floor();
            *max_tokens = (*max_tokens).max(padded.min(f64::from(u32::MAX)) as u32);
        }
    }
}

/// The least tokens at once for a stream of a pressed fleet on a longer limit, whose last
/// assignment was `last` ([`MIN_PRESSED_TOKENS`]).
pub fn pressed_floor(last: Option<Assignment>) -> u64 {
    match last.map(|a| a.strategy) {
        Some(Strategy::TokenBucket { .. }) => MIN_PRESSED_TOKENS,
        _ => 1,
    }
}

/// The most tokens at once a stream without a rate yet may get from a room of `room_now`
/// (the first grant of a cold bucket, or a new Envoy's): an even part of the room among the
/// streams that may share it (`sharers`: the counter's streams in the fleet, or every stream
/// open on this replica and the rest of the fleet's on the counter, whichever is more) and
/// the live `replicas` (each may be granting the same room before the fleet's counts meet),
/// at least one token.
///
/// Why: a first grant is taken at once by a burst, and the streams that report after it get
/// their shares of the same room before the earlier grants are revised (at their streams'
/// next refresh, up to a second later, when a burst is long over). Granting the whole room
/// to the first stream, half of it to the second, and so on handed a cold bucket's burst
/// over ten Envoys on two replicas twice the limit (the simulator's "cold burst").
pub fn first_grant_cap(room_now: u64, sharers: u64, replicas: u32) -> u64 {
    let ways = sharers.max(1).saturating_mul(u64::from(replicas.max(1)));
    (room_now / ways).max(1)
}

/// The assignment for `fraction` of the room's rate and `burst` of its tokens at once,
/// those capped at `cap`.
pub fn assign_capped(
    room: &Room,
    fraction: f64,
    burst: f64,
    cap: u64,
    ttl: Duration,
) -> Assignment {
    let max_tokens = ((room.now as f64 * clamp_fraction(burst)).floor() as u64).min(cap);
    with_tokens(room, clamp_fraction(fraction), max_tokens, ttl)
}

/// A token bucket of `max_tokens` (at least 1) refilled at `rate` tokens a second, lasting
/// `ttl`: when the rate rounds to no token per [`MAX_FILL_INTERVAL_S`], one per that long,
/// as near to none as Envoy can be told (a bucket that holds its tokens and nearly stops,
/// where `DenyAll` would leave the next bucket to start full).
pub fn bucket_of(max_tokens: u64, rate: f64, ttl: Duration) -> Assignment {
    let (tokens_per_fill, fill_interval_s) = fill(rate).unwrap_or((1, MAX_FILL_INTERVAL_S));
    Assignment {
        strategy: Strategy::TokenBucket {
            max_tokens: u32::try_from(max_tokens.max(1)).unwrap_or(u32::MAX),
            tokens_per_fill,
            fill_interval_s,
        },
        ttl_s: whole_secs(ttl),
    }
}

/// A fraction as [`assign`] takes it: between 0 and 1, `NaN` as 0.
fn clamp_fraction(fraction: f64) -> f64 {
    if fraction > 0.0 {
        fraction.min(1.0)
    } else {
        0.0
    }
}

/// The assignment for `fraction` of `room`'s rate and `max_tokens` at once (see [`assign`]).
///
/// A [`short`](Room::short) limit's stream, and any at a limit that drains, gets at least a
/// token at once ([`assign_split`] gives a short limit's a second of its rate, whatever the
/// room read after the last report, unless it is a young stream's capped first grant). No
/// stream's rate is held to its capacity (Envoy's bucket refills continuously at
/// `tokens_per_fill / fill_interval`, whatever it holds): a fill capped at a capacity cut
/// from the room held a busy stream far below its share, and a new Envoy, whose first grant
/// is a token or two, at two thirds of its share until its second report.
fn with_tokens(room: &Room, fraction: f64, max_tokens: u64, ttl: Duration) -> Assignment {
    if room.exhausted() {
        return Assignment {
            strategy: Strategy::DenyAll,
            ttl_s: whole_secs(Duration::from_millis(room.until_ms)),
        };
    }
    let rate = room.rate.min(room.absorbs()) * fraction;
    // At a limit that drains (not exhausted, no room at once), a stream runs its share of
    // what drains from a bucket of one: none would deny it for the whole TTL.
    let max_tokens = if room.short || room.now == 0 {
        max_tokens.max(1)
    } else {
        max_tokens
    };
    let max_tokens = u32::try_from(max_tokens).unwrap_or(u32::MAX);
    let strategy = match fill(rate).filter(|_| max_tokens > 0) {
        Some((tokens_per_fill, fill_interval_s)) => Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        },
        None => Strategy::DenyAll,
    };
    Assignment {
        strategy,
        ttl_s: whole_secs(ttl),
    }
}

/// `rate` tokens per second as (`tokens_per_fill`, whole seconds of `fill_interval`), at most
/// `rate`; `None` when that is no token at all.
///
/// The fill interval of 1 to [`MAX_PRECISION_FILL_S`] seconds that loses the least to
/// rounding (the shortest of equals); when none of them takes a token, one token per the
/// whole seconds that take at least one. So 0.84 a second is 5 every 6 s (0.83), not one
/// every 2 s (0.5): a share rounded down that far starves a stream under the limit.
fn fill(rate: f64) -> Option<(u32, u32)> {
    if rate.is_nan() || rate <= 0.0 {
        return None;
    }
    let mut best = (0u32, 1u32);
    for interval in 1..=MAX_PRECISION_FILL_S {
        let tokens = (rate * f64::from(interval))
            .floor()
            .min(f64::from(u32::MAX)) as u32;
        // tokens / interval > best.0 / best.1, without division.
        if u64::from(tokens) * u64::from(best.1) > u64::from(best.0) * u64::from(interval) {
            best = (tokens, interval);
        }
    }
    if best.0 > 0 {
        return Some(best);
    }
    let interval = (1.0 / rate).ceil();
    if interval > f64::from(MAX_FILL_INTERVAL_S) {
        return None;
    }
    Some((1, interval as u32))
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "share_fleet_tests.rs"]
mod fleet_tests;
