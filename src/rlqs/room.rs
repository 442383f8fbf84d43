//! What one counter leaves the fleet of Envoy streams sharing it ([`Room`]): its tokens at
//! once, its steady rate and what comes back, how far it is past the limit, and when the
//! streams must be denied; and the unused room handed back as rate ([`catch_up`]). Pure:
//! built from a counter's state, which `engine.rs` reads from the limiter.

use crate::core::limit::{Algorithm, Limit};

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
    /// How far the fleet's count is past the limit (a bucket's debt), in tokens.
    pub over: u64,
    /// Tokens per second that come back to the fleet whatever it does: a bucket's refill, a
    /// sliding window's count draining as its previous epoch slides out (at most the
    /// steady rate; nothing in a cold window's first epoch), nothing in a fixed window.
    pub drain: f64,
    /// The limit gives its room back within one Envoy reporting interval ([`LAG_S`]): a
    /// bucket that refills from empty to full, or a window that passes, in that time. Then
    /// a report charges as much as the whole room at once, and the room read after it says
    /// nothing of whether the fleet keeps to the rate: its streams' buckets, whose rates add
    /// up to the limit's, are what keep it there ([`Room::exhausted`]).
    pub short: bool,
    /// A window limit's current epoch; `None` for a bucket.
    pub epoch: Option<Epoch>,
}

/// A window limit's current epoch (windows are aligned to the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    /// Milliseconds until it ends (`Verdict::reset_ms`), at least 1.
    pub left_ms: u64,
    /// Its length: the limit's window.
    pub window_ms: u64,
    /// What the fleet may take in it: the limit (its count starts from 0).
    pub limit: u64,
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
    /// needs its first grants held to the epoch's room too (a full bucket plus a window of
    /// refill is twice the limit): `engine`'s `young.rs`, by the [`Epoch`] given here.
    pub fn window(limit: &Limit, count: u64, prev: u64, reset_ms: u64) -> Room {
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
        let rpu = u64::from(limit.requests_per_unit);
        let drain = match limit.algorithm {
            Algorithm::SlidingWindow => {
                (prev as f64 * 1000.0 / limit.window_ms.max(1) as f64).min(steady_rate(limit))
            }
            _ => 0.0,
        };
        Room {
            now: rpu.saturating_sub(count),
            rate: steady_rate(limit),
            until_ms,
            over: count.saturating_sub(rpu),
            drain,
            short: limit.window_ms <= LAG_MS,
            epoch: Some(Epoch {
                left_ms: reset_ms.clamp(1, limit.window_ms.max(1)),
                window_ms: limit.window_ms,
                limit: rpu,
            }),
        }
    }

    /// The room of a token bucket limit whose fleet-wide bucket owes `owed` tokens (its
    /// burst less what it holds; past the burst, a debt): what it holds (at most its burst)
    /// at once, refilled at `requests_per_unit` per window.
    pub fn bucket(limit: &Limit, owed: u64) -> Room {
        let burst = match limit.algorithm {
            Algorithm::TokenBucket { burst } => u64::from(burst),
            _ => u64::from(limit.requests_per_unit),
        };
        let rpu = u64::from(limit.requests_per_unit).max(1);
        Room {
            now: burst.saturating_sub(owed),
            rate: steady_rate(limit),
            // The time one token takes, rounded up so room has surely returned by then.
            until_ms: limit.window_ms.div_ceil(rpu),
            over: owed.saturating_sub(burst),
            drain: steady_rate(limit),
            short: burst.saturating_mul(limit.window_ms) / rpu <= LAG_MS,
            epoch: None,
        }
    }

    /// The most tokens a second the streams together may be handed: what comes back
    /// ([`drain`](Room::drain)) and the room spread over a reporting interval ([`LAG_S`]);
    /// unbounded for a [`short`](Room::short) limit, whose streams' rates are what hold it.
    ///
    /// Why: the count learns what the streams admit only at their reports, so a rate past
    /// this admits up to an interval of it past the limit before a report turns them to
    /// `DenyAll`: in a window's first epoch, where nothing drains, two Envoys at twice a
    /// limit of 600 a minute ran into 1.10× it at 5 s reports.
    pub fn absorbs(&self) -> f64 {
        if self.short {
            return f64::INFINITY;
        }
        self.drain + self.now as f64 / LAG_S
    }

    /// Whether the fleet must be denied (`DenyAll` until room returns): no room at once, and
    /// for a [`short`](Room::short) limit its count past the limit by more than a reporting
    /// interval of its rate; for a longer one, past the limit at all or nothing draining.
    ///
    /// Usage at a limit is no reason to deny. At a short limit each report charges up to a
    /// reporting interval's worth at once, which reads as no room although the streams'
    /// buckets keep the fleet to the rate: denying then (and the new, full bucket after it)
    /// held a lone Envoy at a 50/s bucket of burst 50 to 0.6× what an exact bucket admits.
    /// A sliding window at its limit drains, and the streams are handed what it drains: a
    /// deny there ended with every stream's bucket starting full again, and a fleet at its
    /// limit swung between the two (a new Envoy two intervals in, sampled as it was denied,
    /// ran none of its share).
    pub fn exhausted(&self) -> bool {
        self.now == 0
            && if self.short {
                self.over as f64 > self.rate * LAG_S
            } else {
                self.over > 0 || self.drain <= 0.0
            }
    }
}

/// Envoy 1.40's reporting interval, the longest a stream's usage waits to be counted.
const LAG_MS: u64 = 5_000;

/// [`LAG_MS`] in seconds.
const LAG_S: f64 = LAG_MS as f64 / 1000.0;

/// How many seconds a counter's unused room is handed back over as rate ([`catch_up`]).
pub const CATCH_UP_S: f64 = 10.0;

/// `room` with its unused tokens handed back as rate on top of the steady one: `now` tokens
/// over [`CATCH_UP_S`] (a window's limit less its count, a bucket's tokens held).
///
/// Why: the streams' rates add up to the limit's steady rate, and that is all a busy stream
/// gets: when its bucket is replaced, Envoy carries its level in proportion, so an empty
/// bucket stays empty however large the new one, and the room handed out as capacity never
/// reaches it. Every fraction of a token a replacement or the fill's rounding drops is then
/// lost for good, and the count settles below the limit with the room unused: with the
/// streams of two and three replicas sharing one rate through the presence exchange, the
/// simulator measured 0.75x (10 Envoys) and 0.3x (50) a window's limit admitted at twice it,
/// and 0.82x of an exact bucket's admitted on a bucket rule (a full bucket's refill is lost
/// too). Handed back as rate, the room is what the count lacks; at the limit there is none.
///
/// A [`short`](Room::short) limit's room is not handed back: it refills within a report
/// interval while the streams spend what they have not reported yet, so what it holds at a
/// read is mostly spent already (a lone Envoy reporting every 5 s ran at 1.10× the rate on
/// top of it).
pub fn catch_up(room: &Room) -> Room {
    if room.short {
        return *room;
    }
    Room {
        rate: room.rate + room.now as f64 / CATCH_UP_S,
        ..*room
    }
}

/// A limit's rate in tokens per second.
fn steady_rate(limit: &Limit) -> f64 {
    f64::from(limit.requests_per_unit) * 1000.0 / limit.window_ms.max(1) as f64
}

#[cfg(test)]
#[path = "room_tests.rs"]
mod tests;
