//! A token bucket's arithmetic (GCRA) on its theoretical arrival time, `tat`: the moment it is
//! full again (Unix ns). Local mode's buckets (`bucket.rs`), the exact rules' store steps
//! (`global/exact/bucket.rs`) and the in-memory twin of the sync's bucket script
//! (`global/memory/mod.rs`) all spend, give back and check tokens with these functions, in
//! whole nanoseconds; the Lua scripts share one prelude that mirrors them
//! (`global/redis/gcra.lua`).

// As the core names it (the limit vocabulary), not through its defining module.
use super::Limit;

/// Nanoseconds in a millisecond.
pub(crate) const NS_PER_MS: u64 = 1_000_000;

/// The sizes of a bucket limit, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Time to refill one token (`T`), at least 1.
    pub interval_ns: u64,
    /// `burst · T`: how far ahead of now the `tat` of an empty bucket is.
    pub capacity_ns: u64,
    /// How far ahead the `tat` may go: one capacity below empty (strict debt).
    pub max_ahead_ns: u64,
    /// The capacity in tokens.
    pub burst: u32,
}

impl Geometry {
    /// The geometry of a bucket limit (a window limit reads as a bucket of its window).
    pub fn of(limit: &Limit) -> Geometry {
        let burst = limit.capacity();
        let rpu = u64::from(limit.requests_per_unit.max(1));
        // A window is at most 10 years (`rules/compile/`): 3.2e17 ns fits a u64.
        let window_ns = limit.window_ms.saturating_mul(NS_PER_MS);
        // Rounded to the nearest nanosecond: 3 a second refill every 333,333,333 ns.
        let interval_ns = (window_ns.saturating_add(rpu / 2) / rpu).max(1);
        Geometry::new(interval_ns, burst)
    }

    /// A bucket of `burst` tokens, one every `interval_ns`: a capacity of `burst` intervals,
    /// and strict debt down to one more capacity.
    pub(crate) fn new(interval_ns: u64, burst: u32) -> Geometry {
        let capacity_ns = interval_ns.saturating_mul(u64::from(burst));
        Geometry {
            interval_ns,
            capacity_ns,
            max_ahead_ns: capacity_ns.saturating_mul(2),
            burst,
        }
    }

    /// Tokens refilled per second.
    pub(crate) fn refill_per_sec(&self) -> f64 {
        1e9 / self.interval_ns as f64
    }

    /// `tokens · T`, saturating.
    pub fn span(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.interval_ns)
    }

    /// Whole tokens in `ns`, rounded up.
    pub fn tokens_up(&self, ns: u64) -> u64 {
        ns.div_ceil(self.interval_ns)
    }
}

/// How far `tat` is ahead of `now` (ns): what the bucket owes (0: full).
pub fn owed(tat: u64, now: u64) -> u64 {
    tat.saturating_sub(now)
}

/// Whether tokens worth `need` ns fit a bucket of `g` that owes `owed` ns: whole or nothing,
/// never past empty.
pub fn fits(g: &Geometry, owed: u64, need: u64) -> bool {
    owed.saturating_add(need) <= g.capacity_ns
}

/// `tat` after spending tokens worth `ns` at `now`, the first of them at `since` (at most
/// `now`): from the later of `tat` and `since` (a bucket full before `since` had refilled for
/// the tokens spent earlier), never below `now`, and at most `max_ahead` ahead of now — or
/// where it was, if further (a spend never moves it back). Local mode spends at `now`.
pub fn spend(tat: u64, since: u64, now: u64, ns: u64, max_ahead: u64) -> u64 {
    tat.max(since)
        .saturating_add(ns)
        .max(now)
        .min(now.saturating_add(max_ahead).max(tat))
}

/// `tat` after giving back tokens worth `ns` at `now` (`since` as for [`spend`]): never past
/// full, i.e. never below `now`.
pub fn give_back(tat: u64, since: u64, now: u64, ns: u64) -> u64 {
    tat.max(since).saturating_sub(ns).max(now)
}

/// `tat` after a run of `tokens` (negative: given back) of `interval_ns` each, as the sync's
/// store applies one: [`spend`] or [`give_back`]. A run of 0 tokens leaves it as it is.
pub fn run(tat: u64, since: u64, now: u64, tokens: i64, interval_ns: u64, max_ahead: u64) -> u64 {
    let ns = tokens.unsigned_abs().saturating_mul(interval_ns);
    match tokens.signum() {
        1 => spend(tat, since, now, ns, max_ahead),
        -1 => give_back(tat, since, now, ns),
        _ => tat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000_000_000;
    /// 3 a second, bursts of 4.
    const G: Geometry = Geometry {
        interval_ns: 333_333_333,
        capacity_ns: 1_333_333_332,
        max_ahead_ns: 2_666_666_664,
        burst: 4,
    };

    #[test]
    fn a_spend_counts_from_the_later_of_tat_and_its_start_never_below_now() {
        // A full bucket (tat in the past): from now.
        assert_eq!(spend(NOW - 5, NOW, NOW, 7, G.max_ahead_ns), NOW + 7);
        // A run that began before now, on a bucket full since: from its start.
        let since = NOW - 100;
        assert_eq!(spend(NOW - 500, since, NOW, 300, G.max_ahead_ns), NOW + 200);
        // ...but never below now.
        assert_eq!(spend(NOW - 500, since, NOW, 30, G.max_ahead_ns), NOW);
        // A bucket in debt: from its tat.
        assert_eq!(spend(NOW + 50, since, NOW, 30, G.max_ahead_ns), NOW + 80);
    }

    #[test]
    fn a_spend_stops_one_capacity_below_empty_and_never_moves_tat_back() {
        let far = NOW + G.max_ahead_ns;
        assert_eq!(
            spend(NOW, NOW, NOW, 10 * G.capacity_ns, G.max_ahead_ns),
            far
        );
        assert_eq!(spend(far + 9, NOW, NOW, 1, G.max_ahead_ns), far + 9);
    }

    #[test]
    fn a_refund_never_goes_past_full() {
        assert_eq!(give_back(NOW + 500, NOW, NOW, 200), NOW + 300);
        assert_eq!(give_back(NOW + 500, NOW, NOW, 900), NOW);
        assert_eq!(give_back(NOW - 500, NOW, NOW, 1), NOW);
    }

    #[test]
    fn a_run_spends_or_gives_back_by_its_sign_and_0_tokens_change_nothing() {
        let t = G.interval_ns;
        assert_eq!(run(NOW, NOW, NOW, 2, t, G.max_ahead_ns), NOW + 2 * t);
        assert_eq!(run(NOW + 3 * t, NOW, NOW, -2, t, G.max_ahead_ns), NOW + t);
        assert_eq!(run(NOW - 5, NOW, NOW, 0, t, G.max_ahead_ns), NOW - 5);
    }

    #[test]
    fn tokens_fit_up_to_the_capacity_to_the_nanosecond() {
        assert!(fits(&G, 0, G.span(4)));
        assert!(!fits(&G, 1, G.span(4)));
        assert!(fits(&G, owed(NOW + G.interval_ns, NOW), G.span(3)));
        assert_eq!(owed(NOW - 1, NOW), 0);
    }
}
