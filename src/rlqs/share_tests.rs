//! Tests of the sharing arithmetic, with a manual `now`: the demand estimate, the split, the
//! assignment under Envoy 1.40's whole-second reading, and the properties that hold them
//! together (never more than the room; an idle stream's share reused within two reports).

use proptest::prelude::{prop, prop_assert, prop_assert_eq, proptest};

use super::*;
use crate::rlqs::replace::{carried_tokens, must_send};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as PbStrategy,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

/// Envoy 1.40's real reporting cadence.
const INTERVAL: Duration = Duration::from_secs(5);

fn counts(allowed: u64, denied: u64) -> Counts {
    Counts { allowed, denied }
}

fn at(secs: u64) -> UnixMillis {
    UnixMillis::from_secs(secs)
}

/// A demand after a first report (elapsed 0) at t = 0 and one report of `requests` every
/// interval after it, the last at `at(5 × requests.len())`.
fn demand_after(requests: &[u64]) -> Demand {
    let mut d = Demand::default();
    d.observe(counts(1, 0), Duration::ZERO, at(0));
    for (i, &r) in requests.iter().enumerate() {
        d.observe(counts(r, 0), INTERVAL, at(5 * (i as u64 + 1)));
    }
    d
}

// === Demand ===

#[test]
fn a_first_report_gives_no_rate_yet() {
    let mut d = Demand::default();
    assert_eq!(d.rate(at(0)), None);
    d.observe(counts(7, 3), Duration::ZERO, at(0));
    assert_eq!(d.rate(at(0)), None);
    assert_eq!(d.rate(at(4)), None);
}

#[test]
fn a_report_over_an_interval_gives_allowed_plus_denied_per_second() {
    let d = demand_after(&[0]);
    assert_eq!(d.rate(at(5)), Some(0.0));
    let mut d = Demand::default();
    d.observe(counts(60, 40), INTERVAL, at(5));
    assert_eq!(d.rate(at(5)), Some(20.0));
}

#[test]
fn a_busy_stream_is_followed_at_its_first_busy_report() {
    let d = demand_after(&[10, 10, 10, 500]);
    assert_eq!(d.rate(at(20)), Some(100.0));
}

#[test]
fn a_busy_stream_gone_idle_reads_zero_at_its_first_idle_report() {
    let d = demand_after(&[100, 100, 100]);
    assert_eq!(d.rate(at(15)), Some(20.0));
    let d = demand_after(&[100, 100, 100, 0]);
    assert_eq!(d.rate(at(20)), Some(0.0));
    // Under a quarter of what the report before predicts is a fall, read at once; a third
    // is within chance, pooled.
    let d = demand_after(&[40, 40, 4]);
    assert_eq!(d.rate(at(15)), Some(0.8));
    let d = demand_after(&[20, 20, 6]);
    assert_eq!(d.rate(at(15)), Some(26.0 / 10.0));
}

#[test]
fn a_quiet_stream_is_read_over_reports_that_hold_enough_requests() {
    // One or two requests a report: pooled back until eight (or four reports).
    let d = demand_after(&[3, 0, 1, 2]);
    assert_eq!(d.rate(at(20)), Some(6.0 / 20.0));
    let d = demand_after(&[2, 5, 0, 4]);
    assert_eq!(d.rate(at(20)), Some(9.0 / 15.0));
    // Eight in the latest alone: that one.
    let d = demand_after(&[1, 1, 1, 8]);
    assert_eq!(d.rate(at(20)), Some(8.0 / 5.0));
}

#[test]
fn the_estimate_weighs_reports_by_their_elapsed_time() {
    let mut d = Demand::default();
    d.observe(counts(1, 0), Duration::from_secs(1), at(1));
    d.observe(counts(3, 0), Duration::from_secs(4), at(5));
    // 4 requests over 5 s, not the mean of 1/s and 0.75/s.
    assert_eq!(d.rate(at(5)), Some(0.8));
}

#[test]
fn a_stream_that_stops_reporting_is_idle_after_two_of_its_intervals() {
    let d = demand_after(&[100]);
    assert_eq!(d.rate(at(15)), Some(20.0));
    assert_eq!(d.rate(at(16)), Some(0.0));
}

#[test]
fn counts_near_2_pow_64_give_a_finite_demand() {
    let mut d = Demand::default();
    d.observe(counts(u64::MAX, u64::MAX), Duration::from_millis(1), at(0));
    d.observe(counts(u64::MAX, 1), Duration::from_millis(1), at(0));
    let rate = d.rate(at(0)).unwrap();
    assert!(rate.is_finite() && rate > 0.0, "{rate}");
    let f = split(10.0, &[Some(rate), Some(1.0)], Rest::default());
    assert!(f.iter().all(|x| x.is_finite()), "{f:?}");
    assert!(f.iter().sum::<f64>() <= 1.0);
}

// === split ===

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn over_the_rate_the_shares_are_max_min_fair() {
    // Both want more than half: half each, however much more.
    let f = split(20.0, &[Some(30.0), Some(10.0)], Rest::default());
    assert!(close(f[0], 0.5) && close(f[1], 0.5), "{f:?}");
    // One wants less: its demand, and the rest to the other.
    let f = split(20.0, &[Some(30.0), Some(4.0)], Rest::default());
    assert!(close(f[0], 0.8) && close(f[1], 0.2), "{f:?}");
    // Three, levels found past the smallest: 2, then 9 each for the two that want more.
    let f = split(20.0, &[Some(2.0), Some(12.0), Some(40.0)], Rest::default());
    assert!(
        close(f[0], 0.1) && close(f[1], 0.45) && close(f[2], 0.45),
        "{f:?}"
    );
}

#[test]
fn under_the_rate_each_gets_its_demand_or_a_floor_that_fills_the_rate() {
    let f = split(10.0, &[Some(2.0), Some(4.0)], Rest::default());
    assert!(close(f[0], 0.5) && close(f[1], 0.5), "{f:?}");
    // A stream over the even share keeps its demand, the others share what is left.
    let f = split(10.0, &[Some(0.0), Some(1.0), Some(7.0)], Rest::default());
    assert!(
        close(f[0], 0.15) && close(f[1], 0.15) && close(f[2], 0.7),
        "{f:?}"
    );
}

#[test]
fn the_rest_of_the_fleet_counts_in_the_split() {
    let rest = Rest {
        streams: 1,
        demand: 30.0,
    };
    // The other replica's stream wants 30: both want more than 5, so 5 each.
    let f = split(10.0, &[Some(10.0)], rest);
    assert!(close(f[0], 0.5), "{f:?}");
    // Three there wanting 30 together (10 each): a quarter each.
    let rest3 = Rest {
        streams: 3,
        demand: 30.0,
    };
    let f = split(10.0, &[Some(10.0)], rest3);
    assert!(close(f[0], 0.25), "{f:?}");
    // Under the rate, the slack is split among every stream of the fleet, not only ours.
    let rest = Rest {
        streams: 3,
        demand: 0.0,
    };
    let f = split(8.0, &[Some(0.0)], rest);
    assert!(close(f[0], 0.25), "{f:?}");
}

#[test]
fn a_stream_without_a_rate_gets_an_even_share_as_its_prior() {
    // Alone: all of it.
    assert_eq!(split(10.0, &[None], Rest::default()), vec![1.0]);
    // Among four streams known, all idle: a quarter.
    let rest = Rest {
        streams: 2,
        demand: 0.0,
    };
    let f = split(8.0, &[None, Some(0.0)], rest);
    assert!(close(f[0], 0.25) && close(f[1], 0.25), "{f:?}");
    // Among busy ones: its prior (2 = 8 / 4) in full, the busy ones an even part of the rest.
    let rest = Rest {
        streams: 2,
        demand: 20.0,
    };
    let f = split(8.0, &[None, Some(10.0)], rest);
    assert!(close(f[0], 2.0 / 8.0) && close(f[1], 2.0 / 8.0), "{f:?}");
}

#[test]
fn no_rate_no_share() {
    assert_eq!(
        split(0.0, &[Some(5.0), None], Rest::default()),
        vec![0.0; 2]
    );
    assert_eq!(split(f64::NAN, &[Some(5.0)], Rest::default()), vec![0.0]);
    assert!(split(5.0, &[], Rest::default()).is_empty());
}

#[test]
fn bad_demands_are_taken_as_none_or_bounded() {
    let f = split(
        10.0,
        &[Some(f64::NAN), Some(-3.0), Some(f64::INFINITY)],
        Rest {
            streams: 0,
            demand: f64::NAN,
        },
    );
    assert!(
        close(f[0], 0.0) && close(f[1], 0.0) && close(f[2], 1.0),
        "{f:?}"
    );
}

// === assign ===

fn room(now: u64, rate: f64) -> Room {
    Room {
        now,
        rate,
        until_ms: 2500,
        over: 0,
        drain: rate,
        short: false,
        epoch: None,
    }
}

/// A window at its limit with nothing draining: a fixed one, or a first epoch.
fn full(rate: f64) -> Room {
    Room {
        drain: 0.0,
        ..room(0, rate)
    }
}

fn bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval_s: u32) -> Strategy {
    Strategy::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval_s,
    }
}

#[test]
fn a_share_becomes_a_token_bucket_of_its_part_of_the_room_and_rate() {
    let a = assign(&room(100, 10.0), 0.5, Duration::from_secs(15));
    assert_eq!(a.strategy, bucket(50, 5, 1));
    assert_eq!(a.ttl_s, 15);
}

#[test]
fn a_rate_under_one_token_a_second_uses_a_longer_fill_interval() {
    let a = assign(&room(100, 1.0), 0.3, INTERVAL);
    assert_eq!(a.strategy, bucket(30, 3, 10));
    let a = assign(&room(100, 1.0), 0.01, INTERVAL);
    assert_eq!(a.strategy, bucket(1, 1, 100));
}

#[test]
fn a_fractional_rate_picks_the_fill_interval_that_loses_least() {
    // 1.5/s: 3 every 2 s, not 1 every second.
    let a = assign(&room(100, 3.0), 0.5, INTERVAL);
    assert_eq!(a.strategy, bucket(50, 3, 2));
    // 2.0/s exactly: the shortest interval of equals.
    let a = assign(&room(100, 4.0), 0.5, INTERVAL);
    assert_eq!(a.strategy, bucket(50, 2, 1));
}

#[test]
fn a_fill_is_not_held_to_the_capacity() {
    // Two tokens at once, the whole rate refilled: Envoy's bucket refills continuously.
    let a = assign(&room(2, 100.0), 1.0, INTERVAL);
    assert_eq!(a.strategy, bucket(2, 100, 1));
}

#[test]
fn no_room_left_denies_all_until_room_returns_rounded_up() {
    // Nothing drains (a fixed window, a window's first epoch): denied.
    let a = assign(&full(10.0), 1.0, INTERVAL);
    assert_eq!(a.strategy, Strategy::DenyAll);
    assert_eq!(a.ttl_s, 3);
    // Past the limit: denied though it drains.
    let past = Room {
        over: 1,
        ..room(0, 10.0)
    };
    assert_eq!(assign(&past, 1.0, INTERVAL).strategy, Strategy::DenyAll);
    // At the limit of one that drains: its share of what drains, a token at once.
    let at = assign(&room(0, 10.0), 0.5, INTERVAL);
    assert_eq!(at.strategy, bucket(1, 5, 1));
    let mut r = full(10.0);
    r.until_ms = 0;
    assert_eq!(assign(&r, 1.0, INTERVAL).ttl_s, 1);
    r.until_ms = 1000;
    assert_eq!(assign(&r, 1.0, INTERVAL).ttl_s, 1);
}

#[test]
fn a_share_of_no_token_denies_until_the_next_assignment() {
    for (r, fraction) in [(room(100, 10.0), 0.0), (room(3, 10.0), 0.2)] {
        let a = assign(&r, fraction, INTERVAL);
        assert_eq!(a.strategy, Strategy::DenyAll);
        assert_eq!(a.ttl_s, 5);
    }
    // Slower than a token per MAX_FILL_INTERVAL_S.
    let rate = 0.5 / f64::from(MAX_FILL_INTERVAL_S);
    let a = assign(&room(100, rate), 1.0, INTERVAL);
    assert_eq!(a.strategy, Strategy::DenyAll);
}

#[test]
fn ttls_are_whole_seconds_never_under_one() {
    assert_eq!(whole_secs(Duration::ZERO), 1);
    assert_eq!(whole_secs(Duration::from_millis(200)), 1);
    assert_eq!(whole_secs(Duration::from_millis(1001)), 2);
    assert_eq!(whole_secs(Duration::from_secs(u64::MAX)), u32::MAX);
    assert_eq!(assign(&room(10, 1.0), 1.0, Duration::ZERO).ttl_s, 1);
}

#[test]
fn assigning_together_hands_out_the_tokens_rounding_leaves() {
    // 5 tokens among 10 equal streams: alone each rounds to none.
    let r = room(5, 10.0);
    assert_eq!(assign(&r, 0.1, INTERVAL).strategy, Strategy::DenyAll);
    let all = assign_all(&r, &[0.1; 10], INTERVAL);
    assert_eq!(all.iter().map(max_of).sum::<u64>(), 5);
    assert!(
        all[..5].iter().all(|a| a.strategy == bucket(1, 1, 1)),
        "{all:?}"
    );
    assert!(
        all[5..].iter().all(|a| a.strategy == Strategy::DenyAll),
        "{all:?}"
    );
    // The largest remainders first: 0.5 × 3 = 1.5 and 0.3 × 3 = 0.9 get 2 and 1, not 1 and 2.
    let all = assign_all(&room(3, 10.0), &[0.5, 0.3, 0.2], INTERVAL);
    assert_eq!(all.iter().map(max_of).collect::<Vec<_>>(), vec![1, 1, 1]);
    // Never past the streams' fractions together: 0.1 + 0.1 of 5 is one token, not two.
    let all = assign_all(&room(5, 10.0), &[0.1, 0.1], INTERVAL);
    assert_eq!(all.iter().map(max_of).sum::<u64>(), 1);
    // With no room and nothing draining, every stream is denied until it returns.
    let all = assign_all(&full(10.0), &[0.5, 0.5], INTERVAL);
    assert!(all.iter().all(|a| *a
        == Assignment {
            strategy: Strategy::DenyAll,
            ttl_s: 3
        }));
}

// === the proto, what is sent, carried_tokens ===

#[test]
fn strategies_convert_to_the_proto() {
    let pb = strategy_proto(&bucket(50, 3, 2));
    let Some(PbStrategy::TokenBucket(tb)) = pb.strategy else {
        panic!("{pb:?}");
    };
    assert_eq!(tb.max_tokens, 50);
    assert_eq!(tb.tokens_per_fill, Some(UInt32Value { value: 3 }));
    assert_eq!(
        tb.fill_interval,
        Some(PbDuration {
            seconds: 2,
            nanos: 0
        })
    );
    let deny = strategy_proto(&Strategy::DenyAll).strategy;
    assert_eq!(
        deny,
        Some(PbStrategy::BlanketRule(BlanketRule::DenyAll as i32))
    );
    let allow = strategy_proto(&Strategy::AllowAll).strategy;
    assert_eq!(
        allow,
        Some(PbStrategy::BlanketRule(BlanketRule::AllowAll as i32))
    );
    // Never a zero Envoy would read as unlimited or as expired.
    let Some(PbStrategy::TokenBucket(tb)) = strategy_proto(&bucket(0, 0, 0)).strategy else {
        panic!();
    };
    assert_eq!(tb.fill_interval.unwrap().seconds, 1);
    assert_eq!(tb.tokens_per_fill.unwrap().value, 1);
    let a = Assignment {
        strategy: Strategy::DenyAll,
        ttl_s: 0,
    };
    assert_eq!(a.ttl_proto().seconds, 1);
}

#[test]
fn only_a_different_assignment_is_changed() {
    let a = assign(&room(100, 10.0), 0.5, INTERVAL);
    // Sent just now, with its TTL far off: only a difference makes it go out again.
    let changed = |new: &Assignment| must_send(Some((&a, at(0))), new, at(0), 0);
    assert!(!changed(&assign(&room(100, 10.0), 0.5, INTERVAL)));
    assert!(changed(&assign(&room(100, 10.0), 0.4, INTERVAL)));
    assert!(
        !changed(&assign(&room(100, 10.0), 0.5, 2 * INTERVAL)),
        "a later end goes with the renewal"
    );
    assert!(
        changed(&assign(&room(100, 10.0), 0.5, INTERVAL / 4)),
        "an end sooner is news"
    );
    assert!(changed(&assign(&room(0, 10.0), 0.5, INTERVAL)));
    // A room a few hits smaller is no news: the running bucket stays.
    assert!(!changed(&assign(&room(95, 10.0), 0.5, INTERVAL)));
    assert!(changed(&assign(&room(80, 10.0), 0.5, INTERVAL)));
}

#[test]
fn an_assignment_is_sent_when_new_changed_or_about_to_lapse() {
    let a = assign(&room(100, 10.0), 0.5, Duration::from_secs(15));
    let b = assign(&room(100, 10.0), 0.4, Duration::from_secs(15));
    let next = 5000;
    assert!(must_send(None, &a, at(0), next));
    assert!(!must_send(Some((&a, at(0))), &a, at(5), next));
    assert!(must_send(Some((&a, at(0))), &b, at(5), next));
    // Its 15 s would run out before the report due at 15 s + 5 s: refresh it now.
    assert!(!must_send(Some((&a, at(0))), &a, at(9), next));
    assert!(must_send(Some((&a, at(0))), &a, at(10), next));
    // A deny until room returns in 2 s, with the next report 5 s away: a timer is due.
    let deny = assign(&room(0, 10.0), 1.0, INTERVAL);
    assert!(must_send(Some((&deny, at(0))), &deny, at(0), next));
    assert!(!must_send(Some((&deny, at(0))), &deny, at(0), 1000));
}

#[test]
fn a_replacement_bucket_carries_the_old_ones_level() {
    assert_eq!(carried_tokens(100, 40, 50), 20);
    assert_eq!(carried_tokens(3, 1, 10), 3);
    assert_eq!(carried_tokens(0, 0, 10), 0);
    assert_eq!(carried_tokens(10, 99, 7), 7);
    assert_eq!(carried_tokens(u32::MAX, u32::MAX, u32::MAX), u32::MAX);
}

// === together ===

/// Each stream's rate under an assignment, in tokens per second.
fn rate_of(a: &Assignment) -> f64 {
    match a.strategy {
        Strategy::TokenBucket {
            tokens_per_fill,
            fill_interval_s,
            ..
        } => f64::from(tokens_per_fill) / f64::from(fill_interval_s),
        Strategy::DenyAll => 0.0,
        Strategy::AllowAll => f64::INFINITY,
    }
}

fn max_of(a: &Assignment) -> u64 {
    match a.strategy {
        Strategy::TokenBucket { max_tokens, .. } => u64::from(max_tokens),
        _ => 0,
    }
}

#[test]
fn an_idle_streams_share_goes_to_the_busy_one_within_two_reports() {
    // Two Envoys at 2× a 10/s limit; then the first goes idle.
    let r = room(1000, 10.0);
    let (mut idle, mut busy) = (Demand::default(), Demand::default());
    let mut t = 0;
    for d in [&mut idle, &mut busy] {
        d.observe(counts(1, 0), Duration::ZERO, at(t));
    }
    for _ in 0..3 {
        t += 5;
        idle.observe(counts(50, 50), INTERVAL, at(t));
        busy.observe(counts(50, 50), INTERVAL, at(t));
    }
    let f = split(10.0, &[idle.rate(at(t)), busy.rate(at(t))], Rest::default());
    assert!(close(f[0], 0.5) && close(f[1], 0.5), "{f:?}");
    for _ in 0..2 {
        t += 5;
        idle.observe(counts(0, 0), INTERVAL, at(t));
        busy.observe(counts(50, 50), INTERVAL, at(t));
    }
    let f = split(10.0, &[idle.rate(at(t)), busy.rate(at(t))], Rest::default());
    assert_eq!(f, vec![0.0, 1.0]);
    let a = assign(&r, f[1], INTERVAL);
    assert_eq!(a.strategy, bucket(1000, 10, 1));
    assert_eq!(assign(&r, f[0], INTERVAL).strategy, Strategy::DenyAll);
}

proptest! {
    /// The assigned rates and buckets of this replica's streams never sum past the room's.
    #[test]
    fn assignments_never_exceed_the_room(
        now in 0u64..100_000,
        rate in 0.0f64..10_000.0,
        demands in prop::collection::vec(prop::option::of(0.0f64..1e6), 0..40),
        rest_streams in 0u64..100,
        rest_demand in 0.0f64..1e6,
    ) {
        let r = room(now, rate);
        let rest = Rest { streams: rest_streams, demand: rest_demand };
        let fractions = split(rate, &demands, rest);
        prop_assert_eq!(fractions.len(), demands.len());
        prop_assert!(fractions.iter().sum::<f64>() <= 1.0 + 1e-9);
        // With what the same view leaves the rest of the fleet, still at most the whole.
        let streams = (demands.len() as u64 + rest_streams) as f64;
        let prior = rate / streams;
        let total = demands.iter().map(|d| d.unwrap_or(prior)).sum::<f64>() + rest_demand;
        let rests = if total <= rate {
            // Each of the rest's streams its even part of the demand or the floor: at most
            // its demand plus an even part of the slack.
            (rest_demand + rest_streams as f64 * (rate - total) / streams) / rate
        } else {
            // Max-min: the level where every stream's demand up to it adds up to the rate,
            // by bisection (the rest: its streams, at least one, each an even part).
            let n = rest_streams.max(1) as f64;
            let wanted: Vec<f64> = demands.iter().map(|d| d.unwrap_or(prior)).collect();
            let used = |l: f64| wanted.iter().map(|w| w.min(l)).sum::<f64>() + n * (rest_demand / n).min(l);
            let (mut lo, mut hi) = (0.0, rate);
            for _ in 0..200 {
                let mid = (lo + hi) / 2.0;
                if used(mid) < rate { lo = mid } else { hi = mid }
            }
            n * (rest_demand / n).min(lo) / rate
        };
        if rate > 0.0 && !demands.is_empty() {
            prop_assert!(fractions.iter().sum::<f64>() + rests <= 1.0 + 1e-6);
        }
        let alone: Vec<Assignment> =
            fractions.iter().map(|&f| assign(&r, f, INTERVAL)).collect();
        let together = assign_all(&r, &fractions, INTERVAL);
        let total_rate: f64 = together.iter().map(rate_of).sum();
        prop_assert!(total_rate <= rate * (1.0 + 1e-9), "{total_rate} > {rate}");
        let total_max: u64 = together.iter().map(max_of).sum();
        prop_assert!(total_max <= now, "{total_max} > {now}");
        prop_assert!(total_max >= alone.iter().map(max_of).sum::<u64>());
        for a in alone.iter().chain(&together) {
            prop_assert!(a.ttl_s >= 1);
            if let Strategy::TokenBucket { max_tokens, tokens_per_fill, fill_interval_s } =
                a.strategy
            {
                prop_assert!((1..=MAX_FILL_INTERVAL_S).contains(&fill_interval_s));
                prop_assert!(tokens_per_fill >= 1 && max_tokens >= 1);
            }
        }
    }

    /// Whatever the busy streams' demands and the interval, two idle reports free an idle
    /// stream's share for the busy ones once the fleet wants more than the rate: all of it
    /// when its reports before held at least a few requests, all but the couple of requests
    /// a report it still reads as when they held fewer (pooled, `Demand`).
    #[test]
    fn an_idle_share_is_reused_within_two_reports(
        busy in prop::collection::vec(1u64..100_000, 1..10),
        idle_before in 0u64..100_000,
        interval_s in 1u64..10,
    ) {
        let interval = Duration::from_secs(interval_s);
        let mut streams: Vec<Demand> = vec![Demand::default(); busy.len() + 1];
        let mut t = 0;
        for d in &mut streams {
            d.observe(counts(1, 0), Duration::ZERO, at(t));
        }
        for round in 0..4 {
            t += interval_s;
            let idle_now = if round < 2 { idle_before } else { 0 };
            streams[0].observe(counts(idle_now, 0), interval, at(t));
            for (d, &b) in streams[1..].iter_mut().zip(&busy) {
                d.observe(counts(b, 0), interval, at(t));
            }
        }
        let demands: Vec<Option<f64>> = streams.iter().map(|d| d.rate(at(t))).collect();
        let idle = demands[0].unwrap_or(f64::NAN);
        if idle_before >= 4 {
            prop_assert_eq!(idle, 0.0);
        } else {
            prop_assert!(idle <= 2.0 * idle_before as f64 / (4 * interval_s) as f64, "{idle}");
        }
        // A rate under the busy streams' demand: the fleet wants more than it.
        let rate = busy.iter().sum::<u64>() as f64 / interval_s as f64 / 2.0;
        let f = split(rate, &demands, Rest::default());
        prop_assert!(close(f[0], (idle / rate).min(1.0)), "{f:?}");
        prop_assert!((f.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }
}
