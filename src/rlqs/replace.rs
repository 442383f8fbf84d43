//! When a stream's assignment goes out again, and as what: Envoy 1.40 replaces its running
//! token bucket whenever the settings differ (the new one starts at the share of tokens the
//! old one had left, rounded down: [`carried_tokens`]), so each replacement costs the stream
//! the fraction of a token being refilled. This file decides which changes are worth that
//! ([`must_send`], [`hold`]) and what goes out ([`to_send`]); `share.rs` computes the
//! assignments themselves.

use super::share::{Assignment, Strategy, MAX_FILL_INTERVAL_S};
use crate::core::clock::UnixMillis;

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

/// How far a token bucket's capacity may grow before the new one is sent: a larger capacity
/// gives a stream that drains its bucket nothing (Envoy carries the share of tokens left, none),
/// and each replacement drops the fraction of a token being refilled, so a capacity following
/// the room up and down every second costs a busy stream up to a token a second (a tenth of
/// a 10/s share: the simulator measured 0.85× the limit admitted at twice the limit).
const GROW: f64 = 2.0;

/// Whether `new` is another strategy than `last`: another kind, or a token bucket whose rate
/// moved by more than [`CHANGE`] of the larger, or whose capacity shrank by more than
/// [`CHANGE`] of it or grew past [`GROW`] times it (each by more than one token).
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
            let (m0, m1) = (f64::from(*m0), f64::from(*m1));
            let capacity = if m1 < m0 {
                moved(m0, m1, 1.0)
            } else {
                m1 - m0 > ((GROW - 1.0) * m0).max(1.0)
            };
            capacity
                || moved(
                    rate(t0, f0),
                    rate(t1, f1),
                    1.0 / f64::from(MAX_FILL_INTERVAL_S),
                )
        }
        _ => last != new,
    }
}

/// What goes out when [`must_send`] says `new` must: `new` itself, or, when it does not
/// differ from `last` (only a renewal is due, or an end sooner of the same blanket rule),
/// `last`'s strategy with `new`'s TTL. The same settings keep Envoy's running bucket where
/// settings a little off would replace it, dropping the fraction of a token being refilled
/// and rounding the carried level down (`carried_tokens`).
pub fn to_send(last: Option<&Assignment>, new: Assignment) -> Assignment {
    match last {
        Some(last) if !differs(&last.strategy, &new.strategy) => Assignment {
            strategy: last.strategy,
            ttl_s: new.ttl_s,
        },
        _ => new,
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

/// What a stream's new assignment was computed under, for [`hold`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// The fleet's demand on the counter is over the rate (or there is no split): every
    /// change goes out.
    Over,
    /// The fleet's demand fits in the rate, and the stream's rate is read from its reports.
    Under,
    /// The fleet's demand fits in the rate as far as it is known, but the stream has no rate
    /// yet, on a short limit (`Room::short`): its rate is a prior, an even share among the
    /// streams known, which halves as a second one joins. A rate lowered to half or less goes
    /// out; anything else is held as [`Pressure::Under`] holds it.
    ///
    /// Why: a short limit's fleet is held by its streams' rates, and a lone stream's prior is
    /// the whole rate. Two Envoys on a 50/s bucket, the first kept at the whole rate when the
    /// second came (25/s being no less than half), ran at 1.5× the rate until the first's
    /// report five seconds later: 1.13× what an exact bucket admitted over its first ten
    /// seconds. Smaller moves are held still: a prior falling by a third as a third stream
    /// joins, sent, replaced ten Envoys' buckets at each join and cost them 1–2 % of what an
    /// exact bucket admits at a per-second limit.
    Prior,
}

/// `new` as it should replace `last` under `pressure`: while the fleet's demand is under the
/// rate, a token bucket's rate, or its capacity, that went down to no less than half of
/// what Envoy runs keeps what Envoy runs, so only a higher rate or capacity, one halved, or
/// another kind replaces Envoy's bucket (a [`Pressure::Prior`]'s rate halved goes out too).
/// The streams' rates and capacities together may then exceed the limit's rate and the
/// room, by less than twice, while their demand fits in the rate; once it does not, every
/// change goes out (and a young stream's grants are held to what the others' leave,
/// `engine.rs`).
///
/// Why: under the rate, a lower rate or capacity protects nothing (the demand fits), while
/// each replacement drops the fraction of a token being refilled and carries the level in
/// proportion, rounded down (`carried_tokens`): a capacity halved takes half of a quiet
/// stream's unused tokens. Demand estimates of a few requests a report swing by half and
/// more, so following them down and up again replaced quiet streams' buckets about every
/// second at 1 s reports and drained them: the simulator measured 10 % of the limit falsely
/// denied at 0.8x the limit (0.5 % now).
pub fn hold(last: Option<&Assignment>, new: Assignment, pressure: Pressure) -> Assignment {
    let (
        Some(Strategy::TokenBucket {
            max_tokens: m0,
            tokens_per_fill: t0,
            fill_interval_s: f0,
        }),
        Strategy::TokenBucket {
            max_tokens: m1,
            tokens_per_fill: t1,
            fill_interval_s: f1,
        },
    ) = (last.map(|l| l.strategy), new.strategy)
    else {
        return new;
    };
    if pressure == Pressure::Over {
        return new;
    }
    let rate = |t: u32, f: u32| f64::from(t) / f64::from(f.max(1));
    // Lowered to no less than half: the running one stays.
    let keep = |old: f64, new: f64| new < old && 2.0 * new >= old;
    let (r0, r1) = (rate(t0, f0), rate(t1, f1));
    let keep_rate = match pressure {
        Pressure::Prior => keep(r0, r1) && 2.0 * r1 > r0,
        _ => keep(r0, r1),
    };
    let (tokens_per_fill, fill_interval_s) = if keep_rate { (t0, f0) } else { (t1, f1) };
    let max_tokens = if keep(f64::from(m0), f64::from(m1)) {
        m0
    } else {
        m1
    };
    Assignment {
        strategy: Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        },
        ttl_s: new.ttl_s,
    }
}

#[cfg(test)]
#[path = "replace_tests.rs"]
mod tests;
