//! Young streams' grants (`engine.rs`'s split, for members with fewer than two rated
//! reports): held to the room the others' grants leave ([`Quotas::cap_young`]), and on a
//! short window, in the epoch of a stream's first report, to its part of what that epoch has
//! left until it ends ([`Quotas::cap_cold`]). The arithmetic is pure and takes `now`.

use crate::core::clock::UnixMillis;

use super::super::share::{assign_capped, bucket_of, first_grant_cap, Assignment, Room, Strategy};
use super::{Grant, Member, Parts, Quotas, Shares};

// === impl Quotas ===

impl Quotas {
    /// The streams that may share a counter's room as the young ones' grants count them (the
    /// counter's members here, or every stream open here if more, and the rest of the
    /// fleet's), and how many replicas may be granting the same room at once: until the
    /// presence exchange told what the other replicas have, every live one.
    fn sharers(&self, shares: &Shares) -> (u64, u32) {
        let here = (shares.members.len() as u64).max(self.stream_count() as u64);
        let replicas = if shares.rest_known {
            1
        } else {
            self.fleet.live_replicas().max(1)
        };
        (here.saturating_add(shares.rest.streams), replicas)
    }

    /// Holds young streams' grants in `assigned` to cautious ones (`share::first_grant_cap`):
    /// the room less what the others may still take at once, and without a rate yet an even
    /// part of it; on a [`short`](Room::short) limit, only a bucket's first grants.
    ///
    /// Why not the rest of a short limit's: it gives its room back within a report interval,
    /// and a report charges up to that interval's usage at once, so the room read after it
    /// says nothing of what a stream's bucket may take: the streams' rates hold the fleet
    /// (`Room::exhausted`). Capped to that room, a young stream's capacity fell to a token,
    /// and a bucket of one turns down the second of two requests arriving close together;
    /// grown back, it carried a token or two in proportion, many times over (Envoy starts a
    /// replacement at `new max × old level / old max`). A short window's first grants are
    /// held by [`Quotas::cap_cold`] instead; a bucket's stay capped, as a new bucket starts
    /// full.
    pub(super) fn cap_young(
        &self,
        shares: &Shares,
        room: &Room,
        p: &Parts<'_>,
        assigned: &mut [Assignment],
    ) {
        let ttl = self.config.assignment_ttl;
        let (sharers, replicas) = self.sharers(shares);
        let room_here = room.now / u64::from(replicas);
        let first = first_grant_cap(room_here, sharers, 1);
        let held: Vec<u64> = shares.members.iter().map(Member::outstanding).collect();
        let all_held: u64 = held.iter().sum();
        for (i, a) in assigned.iter_mut().enumerate() {
            let rated_or_window = p.demands[i].is_some() || room.epoch.is_some();
            if !p.young[i] || (room.short && rated_or_window) {
                continue;
            }
            let mut cap = room_here.saturating_sub(all_held - held[i]).max(1);
            if p.demands[i].is_none() {
                cap = cap.min(first);
            }
            let over = |m: u32| u64::from(m) > cap;
            match &mut a.strategy {
                // A pressed stream on a longer limit keeps its floor (`share::pressed_floor`)
                // up to the cap: cut to its share of a room near the limit, a newcomer's
                // rounded to none and it was denied.
                Strategy::TokenBucket { max_tokens, .. } if p.pressed && !room.short => {
                    *max_tokens = (*max_tokens).min(u32::try_from(cap).unwrap_or(u32::MAX));
                }
                Strategy::TokenBucket { max_tokens, .. } if over(*max_tokens) => {
                    *a = assign_capped(room, p.fractions[i], p.burst[i], cap, ttl);
                }
                _ => {}
            }
        }
    }

    /// Holds the first grants of the members in the epoch of their first report on a short
    /// window (their `cold_until`) to their parts of the epoch's room ([`part`],
    /// [`first_in_epoch`]); a member whose first grant went out keeps it until the epoch
    /// ends, when its stream looks again (`Share::revisit`).
    ///
    /// Why: Envoy starts a new bucket full, and a bucket of capacity C refilled at r admits
    /// up to C + r·t in t. A first grant of a per-second window's room at once, refilled at
    /// a second of the limit's rate, admitted up to twice the limit in the first second (1.98×
    /// with one Envoy, 1.58–1.94× with two to fifty). Held to the epoch's room, its rate is
    /// what the part leaves, and it gets the limit's share of the rate as the next epoch
    /// begins.
    pub(super) fn cap_cold(
        &self,
        shares: &Shares,
        room: &Room,
        p: &Parts<'_>,
        assigned: &mut [Assignment],
        now: UnixMillis,
    ) {
        let (Some(epoch), true) = (room.epoch, room.short) else {
            return;
        };
        let members = &shares.members;
        let cold: Vec<bool> = members
            .iter()
            .map(|m| m.cold_until.is_some_and(|end| now < end))
            .collect();
        if !cold.contains(&true) {
            return;
        }
        let end = UnixMillis(now.0.saturating_add(epoch.left_ms));
        let (sharers, replicas) = self.sharers(shares);
        let here = sharers.saturating_sub(shares.rest.streams).max(1);
        // What the members' grants may still take before the epoch ends; and what the cold
        // ones claimed of it from their first request on.
        let until: Vec<f64> = members
            .iter()
            .map(|m| m.grant.map_or(0.0, |g| until_end(&g, end, epoch.window_ms)))
            .collect();
        let claimed: f64 = members
            .iter()
            .zip(&cold)
            .filter(|&(_, &c)| c)
            .map(|(m, _)| 1.0 + m.grant.map_or(0.0, |g| claim(&g, end)))
            .sum();
        let left_s = epoch.left_ms as f64 / 1000.0;
        let fleet = if shares.rest_known {
            sharers
        } else {
            sharers.saturating_mul(u64::from(replicas))
        };
        let mut ledger = Ledger {
            slack: 1.0 + COLD_SLACK * (1.0 - 1.0 / fleet.max(1) as f64),
            pool: epoch.limit as f64 * pool_share(here, shares.rest.streams, replicas),
            here,
            claimed,
            unseen: here.saturating_sub(members.len() as u64),
            // What the count may still take before the epoch ends: the room, and what a
            // sliding window's previous epoch gives back meanwhile.
            budget: room.now as f64 + room.drain * left_s,
            others: until.iter().sum(),
        };
        for (i, a) in assigned.iter_mut().enumerate() {
            let Strategy::TokenBucket { max_tokens, .. } = a.strategy else {
                continue;
            };
            if !cold[i] {
                continue;
            }
            if members[i].grant.is_some() {
                // Its first grant went out: it runs until the epoch ends.
                if let Some(kept) = members[i].assigned {
                    *a = kept;
                }
                continue;
            }
            let prior = room.rate * p.fractions[i];
            let part = part(&ledger);
            let (tokens, rate) = first_in_epoch(part, u64::from(max_tokens), prior, epoch.left_ms);
            // The next one's part comes after this one's.
            let taken = tokens as f64 + rate * left_s;
            ledger.claimed += taken;
            ledger.others += taken;
            *a = bucket_of(tokens, rate, self.config.assignment_ttl);
        }
    }
}

/// The end of the epoch a member's first report on `room`'s counter falls in, at `now`,
/// for a [`short`](Room::short) window: until then its grant is its first ([`Quotas::cap_cold`]).
pub(super) fn cold_until(room: &Room, now: UnixMillis) -> Option<UnixMillis> {
    let epoch = room.epoch.filter(|_| room.short)?;
    Some(UnixMillis(now.0.saturating_add(epoch.left_ms)))
}

/// How much more than the room a short window's first epoch may hand out in its members'
/// first grants together, at most: the accuracy target's margin (admitted at most 1.10× the
/// exact limiter's), taken in full by many streams and not at all by a lone one.
///
/// Why: each part is handed out before any stream's demand is read, and requests fall on the
/// streams by chance, so one may get more of the epoch's demand than an even part while
/// another leaves its part unspent: under the limit, the first is denied what the exact
/// limiter admits. A lone stream's demand is all of it: no spread to allow for. Two Envoys
/// at 0.8× a 50/s window, one of them sent 28 of the first second's 40 requests, admitted
/// 0.925× the exact limiter in that second with parts adding up to the room, 0.95× with
/// this; at twice the limit they admit 0.98× and 1.04×.
const COLD_SLACK: f64 = 0.1;

/// This replica's share of a short window's epoch, as its members' first grants in it
/// count it ([`part`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Ledger {
    /// How far the members' parts together may pass the room: 1 plus [`COLD_SLACK`] of it,
    /// less for fewer streams.
    pub(super) slack: f64,
    /// This replica's part of the epoch's room as it began (the limit): its streams' part of
    /// every stream's, or, until the presence exchange told, an even part among the replicas.
    pub(super) pool: f64,
    /// The streams here that may share it ([`Quotas::sharers`]), seen or not.
    pub(super) here: u64,
    /// What the members here in their first epoch claimed: each one's first request (admitted
    /// before any assignment) and its first grant's tokens and refill to the epoch's end.
    pub(super) claimed: f64,
    /// The streams here that have not reported the bucket yet: each one's first request will
    /// be admitted before any assignment.
    pub(super) unseen: u64,
    /// What the count may still take before the epoch ends: with `others`, the bound
    /// whatever the pool says (a member joining settled ones).
    pub(super) budget: f64,
    /// What the members' grants here may still take before the epoch ends.
    pub(super) others: f64,
}

/// The share of a counter's room the `here` streams of this replica hold among `rest` on the
/// others', or, while `rest` is unknown (0), among `replicas` replicas.
fn pool_share(here: u64, rest: u64, replicas: u32) -> f64 {
    if rest == 0 {
        return 1.0 / f64::from(replicas.max(1));
    }
    here as f64 / (here + rest) as f64
}

/// Tokens a grant `g` in a member's first epoch claims of it: its capacity and its refill
/// until the epoch's `end`.
fn claim(g: &Grant, end: UnixMillis) -> f64 {
    g.tokens as f64 + g.rate * end.0.saturating_sub(g.at.0) as f64 / 1000.0
}

/// A member's part of its first epoch, all of it times `l.slack`: an even part of the pool
/// among the streams here after each one's first request, and no more than the pool, less
/// what the others claimed and a first request for each stream not seen yet, leaves; nor
/// than what the count may still take, less what the grants here may. Not below 0.
pub(super) fn part(l: &Ledger) -> f64 {
    let k = l.slack;
    let here = l.here.max(1) as f64;
    let unseen = l.unseen as f64;
    let even = k * (l.pool - here) / here;
    even.min(k * l.pool - l.claimed - unseen)
        .min(k * l.budget - l.others - unseen)
        .max(0.0)
}

/// What a member running `g` may still take before `end`, in an epoch of `window_ms`: the
/// tokens it was handed and has not reported spending, and its refill over the epoch since
/// it was handed them.
pub(super) fn until_end(g: &Grant, end: UnixMillis, window_ms: u64) -> f64 {
    let from = g.at.0.max(end.0.saturating_sub(window_ms));
    let refill = g.rate * end.0.saturating_sub(from) as f64 / 1000.0;
    g.tokens.saturating_sub(g.used) as f64 + refill
}

/// A first grant within `part` of an epoch whose end is `left_ms` away: (capacity, rate).
/// Its capacity is as much of the part as the capacity it would get otherwise
/// (`max_tokens`), at least 1; its rate what the part leaves over the rest of the epoch, at
/// most its `prior` share of the limit's rate.
///
/// Why the capacity first: requests arrive by chance, and a bucket holding the part at once
/// takes a burst that a refill of the same total would turn down: under the limit, every
/// token of it may be wanted early. Why at least a token where the part is less (fifty
/// Envoys on a 50/s window, each one's first request taking its part): a `DenyAll` instead
/// would have the bucket after it start full as the next epoch begins, every stream's at
/// once; a bucket of one that refills as good as never is spent by then wherever requests
/// keep coming, and its replacement starts empty (`carried_tokens`).
pub(super) fn first_in_epoch(part: f64, max_tokens: u64, prior: f64, left_ms: u64) -> (u64, f64) {
    let tokens = (part.max(0.0).floor() as u64).min(max_tokens).max(1);
    let left_s = left_ms.max(1) as f64 / 1000.0;
    let rate = ((part - tokens as f64) / left_s).clamp(0.0, prior.max(0.0));
    (tokens, rate)
}

#[cfg(test)]
#[path = "young_tests.rs"]
mod tests;
