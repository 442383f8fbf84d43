//! The pure arithmetic of sharing one limit among Envoy streams: each (stream, bucket)'s
//! demand estimate ([`Demand`]), the room the fleet may use ([`Room`]), each stream's fraction
//! of it ([`split`]), and the assignment Envoy gets ([`assign`], [`Assignment`]). No I/O, no
//! clock read: `now` is always an argument.
//!
//! Designed for what Envoy 1.40 does, not for the documentation: it reports every 5 s
//! whatever `reporting_interval` says; a new bucket's first report has `time_elapsed` = 0;
//! it reads `fill_interval` and `assignment_time_to_live` in whole seconds (a fill interval
//! under 1 s becomes 0, an unlimited rate; a TTL under 1 s expires at once and the bucket
//! falls back to allow-all), so neither is ever emitted under 1 s here.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as PbStrategy,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use crate::core::clock::UnixMillis;
use crate::core::limit::{Algorithm, Limit};

use super::report::Counts;

/// The longest `fill_interval` emitted, in seconds. A share slower than one token per this
/// long is no share: the stream is denied until its next assignment instead.
pub const MAX_FILL_INTERVAL_S: u32 = 3600;

/// The longest fill interval tried to express a rate of one token per second or more more
/// precisely (`tokens_per_fill` / `fill_interval` rounds the rate down): one Envoy reporting
/// interval, since the assignment is recomputed that often anyway.
const MAX_PRECISION_FILL_S: u32 = 5;

/// A demand larger than this (requests per second) is taken as this: a client's counts go up
/// to `u64::MAX`, and an infinite demand would make the split's sums `NaN`.
const MAX_DEMAND: f64 = 1e15;

/// One (stream, bucket)'s demand estimate, from its successive reports.
///
/// The estimate is the larger of the latest report's rate and the rate over the last two
/// reports together: a busy stream is followed at its first busy report, an idle one falls
/// to half at its first idle report and to zero at its second, and a single short dip in a
/// steady demand only halves it. A stream that stops reporting the bucket (Envoy reports every
/// bucket every interval) counts as idle once two of its intervals have passed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    /// The latest report with a rate, then the one before it.
    samples: [Option<Sample>; 2],
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
        self.samples = [
            Some(Sample {
                requests: counts.demand(),
                elapsed_ms,
            }),
            self.samples[0],
        ];
    }

    /// The demand in requests per second at `now`; `None` until a report with a rate came.
    pub fn rate(&self, now: UnixMillis) -> Option<f64> {
        let latest = self.samples[0]?;
        let last_at = self.last_at?;
        if now.0.saturating_sub(last_at.0) > latest.elapsed_ms.saturating_mul(2) {
            return Some(0.0);
        }
        let latest_rate = per_second(latest.requests, latest.elapsed_ms);
        let pair_rate = match self.samples[1] {
            Some(before) => per_second(
                latest.requests.saturating_add(before.requests),
                latest.elapsed_ms.saturating_add(before.elapsed_ms),
            ),
            None => latest_rate,
        };
        Some(latest_rate.max(pair_rate))
    }
}

/// `requests` over `elapsed_ms` (> 0) as requests per second, at most [`MAX_DEMAND`].
fn per_second(requests: u64, elapsed_ms: u64) -> f64 {
    (requests as f64 * 1000.0 / elapsed_ms as f64).min(MAX_DEMAND)
}

/// What the fleet (every Envoy stream of every replica on one bucket's counter) may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Room {
    /// Tokens the fleet may take at once: a window's limit less the fleet's count in it, a
    /// bucket's tokens held.
    pub now: u64,
    /// Tokens per second the fleet may take from here on: the limit's steady rate.
    pub rate: f64,
    /// When `now` is 0: milliseconds until room returns (the window's reset, a bucket's
    /// refill of one token).
    pub until_ms: u64,
}

// === impl Room ===

impl Room {
    /// The room of a window limit (sliding or fixed) that the fleet has counted `count` in,
    /// its window ending in `reset_ms` (`Verdict::reset_ms`). The rate is the limit's steady
    /// one, `requests_per_unit` per window: the room left is the burst the fleet may take on
    /// top, and once the count reaches the limit the streams are denied until room returns:
    /// the reset of a fixed window; a sliding window's drain of one hit (`window / limit`),
    /// or the reset if sooner.
    ///
    /// What this admits past the limit is what the streams' buckets admit before the count
    /// that reached it is reported: at most a report interval at the rate, `interval / W` of
    /// the limit (1.08× for a minute at Envoy's 5 s). A window as short as a report interval
    /// needs its burst capped too (a full bucket plus a window of refill is twice the limit):
    /// left to the simulator's scenarios to measure and tune.
    pub fn window(limit: &Limit, count: u64, reset_ms: u64) -> Room {
        // A sliding window's count drains as its previous epoch slides out: room returns
        // about one hit per `window / limit`, long before the epoch ends.
        let until_ms = match limit.algorithm {
            Algorithm::SlidingWindow => {
                let drain = limit
                    .window_ms
                    .div_ceil(u64::from(limit.requests_per_unit).max(1));
                drain.min(reset_ms)
            }
            _ => reset_ms,
        };
        Room {
            now: u64::from(limit.requests_per_unit).saturating_sub(count),
            rate: steady_rate(limit),
            until_ms,
        }
    }

    /// The room of a token bucket limit whose fleet-wide bucket holds `tokens`: those (at
    /// most its burst) at once, refilled at `requests_per_unit` per window.
    pub fn bucket(limit: &Limit, tokens: u64) -> Room {
        let burst = match limit.algorithm {
            Algorithm::TokenBucket { burst } => u64::from(burst),
            _ => u64::from(limit.requests_per_unit),
        };
        let rpu = u64::from(limit.requests_per_unit).max(1);
        Room {
            now: tokens.min(burst),
            rate: steady_rate(limit),
            // The time one token takes, rounded up so room has surely returned by then.
            until_ms: limit.window_ms.div_ceil(rpu),
        }
    }
}

/// A limit's rate in tokens per second.
fn steady_rate(limit: &Limit) -> f64 {
    f64::from(limit.requests_per_unit) * 1000.0 / limit.window_ms.max(1) as f64
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
/// plus an even part of the rate left over, so a stream whose demand grows has room before
/// its next report; when it does not fit, each gets a part proportional to its demand, so an
/// idle stream's share goes to the busy ones. The fractions of every stream of the fleet sum
/// to at most 1, so this replica's never hand out more than the room.
pub fn split(rate: f64, demands: &[Option<f64>], rest: Rest) -> Vec<f64> {
    let streams = (demands.len() as f64) + rest.streams as f64;
    if rate.is_nan() || rate <= 0.0 || demands.is_empty() {
        return vec![0.0; demands.len()];
    }
    let prior = rate / streams;
    let wanted: Vec<f64> = demands.iter().map(|d| d.map_or(prior, sanitize)).collect();
    let total = wanted.iter().sum::<f64>() + sanitize(rest.demand);
    wanted
        .into_iter()
        .map(|d| {
            let fraction = if total <= rate {
                (d + (rate - total) / streams) / rate
            } else {
                d / total
            };
            fraction.clamp(0.0, 1.0)
        })
        .collect()
}

/// A demand as the split takes it: finite, between 0 and [`MAX_DEMAND`].
fn sanitize(demand: f64) -> f64 {
    if demand > 0.0 {
        demand.min(MAX_DEMAND)
    } else {
        0.0
    }
}

/// What Envoy does with a bucket's requests: the strategies Envoy 1.40 honours (it fails open
/// on `requests_per_time_unit`, so that is never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A token bucket; every field is at least 1.
    TokenBucket {
        /// The bucket's capacity.
        max_tokens: u32,
        /// Tokens added every fill interval.
        tokens_per_fill: u32,
        /// Whole seconds between fills.
        fill_interval_s: u32,
    },
    /// Every request denied.
    DenyAll,
    /// Every request allowed.
    AllowAll,
}

/// One bucket's assignment: a strategy and its time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// What Envoy does with the bucket's requests.
    pub strategy: Strategy,
    /// Whole seconds until Envoy drops the assignment (at least 1).
    pub ttl_s: u32,
}

// === impl Assignment ===

impl Assignment {
    /// This assignment as the proto's `assignment_time_to_live`.
    pub fn ttl_proto(&self) -> PbDuration {
        PbDuration {
            seconds: i64::from(self.ttl_s.max(1)),
            nanos: 0,
        }
    }
}

/// A strategy as the proto's `RateLimitStrategy`.
pub fn strategy_proto(strategy: &Strategy) -> RateLimitStrategy {
    let strategy = match *strategy {
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        } => PbStrategy::TokenBucket(TokenBucket {
            max_tokens: max_tokens.max(1),
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill.max(1),
            }),
            fill_interval: Some(PbDuration {
                seconds: i64::from(fill_interval_s.max(1)),
                nanos: 0,
            }),
        }),
        Strategy::DenyAll => PbStrategy::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::AllowAll => PbStrategy::BlanketRule(BlanketRule::AllowAll as i32),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

/// Whole seconds of `d`, rounded up, between 1 and `u32::MAX`: Envoy 1.40 drops a TTL under
/// a second at once.
pub fn whole_secs(d: Duration) -> u32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX).max(1)
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
    let fractions: Vec<f64> = fractions.iter().map(|&f| clamp_fraction(f)).collect();
    let exact: Vec<f64> = fractions.iter().map(|f| room.now as f64 * f).collect();
    let mut tokens: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    // The epsilon forgives the sum's float error (ten fractions of 0.1 sum to 0.999…), at
    // the cost of at most a billionth of a token.
    let together = (room.now as f64 * fractions.iter().sum::<f64>().min(1.0) + 1e-9).floor() as u64;
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
        .map(|(&f, t)| with_tokens(room, f, t, ttl))
        .collect()
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
fn with_tokens(room: &Room, fraction: f64, max_tokens: u64, ttl: Duration) -> Assignment {
    if room.now == 0 {
        return Assignment {
            strategy: Strategy::DenyAll,
            ttl_s: whole_secs(Duration::from_millis(room.until_ms)),
        };
    }
    let max_tokens = u32::try_from(max_tokens).unwrap_or(u32::MAX);
    let strategy = match fill(room.rate * fraction, max_tokens) {
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
/// `rate` and with at most `max_tokens` per fill; `None` when that is no token at all.
///
/// At one token per second or more, the fill interval of 1 to [`MAX_PRECISION_FILL_S`]
/// seconds that loses the least to rounding (the shortest of equals); below, one token per
/// the whole seconds that take at least one token.
fn fill(rate: f64, max_tokens: u32) -> Option<(u32, u32)> {
    if rate.is_nan() || rate <= 0.0 || max_tokens == 0 {
        return None;
    }
    if rate < 1.0 {
        let interval = (1.0 / rate).ceil();
        if interval > f64::from(MAX_FILL_INTERVAL_S) {
            return None;
        }
        return Some((1, interval as u32));
    }
    let mut best = (0u32, 1u32);
    for interval in 1..=MAX_PRECISION_FILL_S {
        let tokens = (rate * f64::from(interval))
            .floor()
            .min(f64::from(max_tokens)) as u32;
        // tokens / interval > best.0 / best.1, without division.
        if u64::from(tokens) * u64::from(best.1) > u64::from(best.0) * u64::from(interval) {
            best = (tokens, interval);
        }
    }
    Some(best)
}

/// Whether `new` must be sent now, `last` having been sent at `sent_at` (`None`: nothing sent
/// for the bucket yet), when the next chance to send is `next_ms` away (the stream's next
/// report, Envoy 1.40's 5 s, or a timer the caller sets): when it differs from `last` (another
/// kind, or a token bucket moved by more than [`CHANGE`]), when it must end sooner than
/// `last` does, or when `last`'s TTL runs out before then. A deny-all until room returns sent
/// again a second later ends when it did: no news. A lapsed assignment is not a deny: Envoy falls back to
/// the filter's expired-assignment behaviour (allow-all unless configured), so a `DenyAll`
/// until room returns, shorter than a report interval, needs such a timer at its end.
///
/// Sending the same strategy again is harmless (Envoy 1.40 keeps its running bucket when the
/// settings are identical) and refreshes the TTL. A token bucket with different settings
/// replaces Envoy's running one, which then starts at `floor(new max_tokens × old remaining /
/// old max_tokens)` tokens ([`carried_tokens`]): a stream that spent its burst does not get it
/// back by a change of share.
pub fn must_send(
    last: Option<(&Assignment, UnixMillis)>,
    new: &Assignment,
    now: UnixMillis,
    next_ms: u64,
) -> bool {
    let Some((last, sent_at)) = last else {
        return true;
    };
    let expires = sent_at.0.saturating_add(u64::from(last.ttl_s) * 1000);
    let new_expires = now.0.saturating_add(u64::from(new.ttl_s) * 1000);
    differs(&last.strategy, &new.strategy)
        || expires <= now.0.saturating_add(next_ms)
        // Only an end that comes sooner is news (TTLs count whole seconds): a later one
        // goes out with the renewal.
        || new_expires.saturating_add(1000) < expires
}

/// How far a token bucket's rate or capacity may move before the new one is sent: a window's
/// room shrinks with every hit counted, and resending each small change would replace
/// Envoy's bucket every second (each replacement rounds its tokens down) and send a message
/// per bucket per second, which the protocol is there to avoid.
const CHANGE: f64 = 1.0 / 8.0;

/// Whether `new` is another strategy than `last`: another kind, or a token bucket whose rate
/// or capacity moved by more than [`CHANGE`] of the larger (and by more than one token).
pub fn differs(last: &Strategy, new: &Strategy) -> bool {
    match (last, new) {
        (
            Strategy::TokenBucket {
                max_tokens: m0,
                tokens_per_fill: t0,
                fill_interval_s: f0,
            },
            Strategy::TokenBucket {
                max_tokens: m1,
                tokens_per_fill: t1,
                fill_interval_s: f1,
            },
        ) => {
            let moved = |a: f64, b: f64, unit: f64| (a - b).abs() > (CHANGE * a.max(b)).max(unit);
            let rate = |t: &u32, f: &u32| f64::from(*t) / f64::from((*f).max(1));
            moved(f64::from(*m0), f64::from(*m1), 1.0)
                || moved(
                    rate(t0, f0),
                    rate(t1, f1),
                    1.0 / f64::from(MAX_FILL_INTERVAL_S),
                )
        }
        _ => last != new,
    }
}

/// The tokens a replacement token bucket of `new_max` starts with when the one it replaces,
/// of `old_max`, held `old_remaining`: Envoy 1.40's `floor(new max × old remaining / old
/// max)`.
pub fn carried_tokens(old_max: u32, old_remaining: u32, new_max: u32) -> u32 {
    if old_max == 0 {
        return 0;
    }
    let carried = u64::from(new_max) * u64::from(old_remaining.min(old_max)) / u64::from(old_max);
    carried as u32
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod tests;
