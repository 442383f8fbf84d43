//! Tests of when an assignment goes out again and as what: what replaces Envoy's running
//! bucket and what keeps it (a renewal, a capacity that only grew a little, a lower rate while
//! the fleet is under its rate), and the fill of rates under one token a second.

use std::time::Duration;

use super::*;
use crate::rlqs::share::{assign, over_rate, Rest, Room};

const TTL: Duration = Duration::from_secs(15);

fn bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval_s: u32) -> Assignment {
    Assignment {
        strategy: Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        },
        ttl_s: 15,
    }
}

fn at(secs: u64) -> UnixMillis {
    UnixMillis::from_secs(secs)
}

/// Whether `new` goes out right after `last` was sent, its TTL far off.
fn news(last: &Assignment, new: &Assignment) -> bool {
    must_send(Some((last, at(0))), new, at(0), 1000)
}

#[test]
fn a_renewal_sends_the_settings_envoy_runs() {
    let running = bucket(40, 5, 1);
    // A few tokens of room fewer: no news, so a renewal due carries the running settings
    // (Envoy keeps its bucket) with the new TTL.
    let new = Assignment {
        ttl_s: 20,
        ..bucket(38, 5, 1)
    };
    assert!(!news(&running, &new));
    assert!(must_send(Some((&running, at(0))), &new, at(14), 1000));
    let sent = to_send(Some(&running), new);
    assert_eq!(sent.strategy, running.strategy);
    assert_eq!(sent.ttl_s, 20);
    // News goes out as it is; so does a first assignment.
    let other = bucket(20, 5, 1);
    assert_eq!(to_send(Some(&running), other), other);
    assert_eq!(to_send(None, new), new);
}

#[test]
fn a_capacity_must_shrink_by_an_eighth_or_double_to_be_news() {
    let running = bucket(40, 5, 1);
    assert!(news(&running, &bucket(34, 5, 1)), "shrank by 15 %");
    assert!(!news(&running, &bucket(36, 5, 1)), "shrank by 10 %");
    assert!(!news(&running, &bucket(80, 5, 1)), "grew to twice");
    assert!(news(&running, &bucket(81, 5, 1)), "grew past twice");
    // A capacity of one grows by more than a token to be news.
    assert!(!news(&bucket(1, 1, 1), &bucket(2, 1, 1)));
    assert!(news(&bucket(1, 1, 1), &bucket(3, 1, 1)));
    // The rate still moves both ways.
    assert!(news(&running, &bucket(40, 6, 1)));
    assert!(news(&running, &bucket(40, 4, 1)));
}

#[test]
fn under_the_rate_a_lower_rate_or_capacity_keeps_the_running_one() {
    let running = bucket(40, 5, 1);
    let lower = bucket(30, 3, 1);
    // Under the rate, lowered to no less than half: what Envoy runs stays.
    assert_eq!(hold(Some(&running), lower, Pressure::Under), running);
    // Halved or more: news, as for a stream whose demand fell away; each on its own.
    assert_eq!(
        hold(Some(&running), bucket(30, 2, 1), Pressure::Under),
        bucket(40, 2, 1)
    );
    assert_eq!(
        hold(Some(&running), bucket(19, 3, 1), Pressure::Under),
        bucket(19, 5, 1)
    );
    // Over the rate, or a higher rate or capacity, or nothing before: as computed.
    assert_eq!(hold(Some(&running), lower, Pressure::Over), lower);
    let higher = bucket(50, 7, 1);
    assert_eq!(hold(Some(&running), higher, Pressure::Under), higher);
    assert_eq!(hold(None, lower, Pressure::Under), lower);
    let deny = Assignment {
        strategy: Strategy::DenyAll,
        ttl_s: 1,
    };
    assert_eq!(hold(Some(&running), deny, Pressure::Under), deny);
    // A prior halved goes out (a lone stream's whole rate as a second one joins); less is
    // held as under the rate, and so is its capacity.
    let prior = bucket(40, 4, 1);
    assert_eq!(
        hold(Some(&prior), bucket(30, 2, 1), Pressure::Prior),
        bucket(40, 2, 1)
    );
    assert_eq!(hold(Some(&prior), bucket(30, 3, 1), Pressure::Prior), prior);
    assert_eq!(hold(Some(&prior), bucket(30, 2, 1), Pressure::Under), prior);
}

#[test]
fn over_the_rate_counts_priors_and_the_rest_of_the_fleet() {
    let none = Rest::default();
    assert!(!over_rate(10.0, &[Some(3.0), Some(4.0)], none));
    assert!(over_rate(10.0, &[Some(6.0), Some(5.0)], none));
    // A stream without a rate counts at its prior: 10 over 2 streams.
    assert!(!over_rate(10.0, &[Some(5.0), None], none));
    assert!(over_rate(10.0, &[Some(5.5), None], none));
    let rest = Rest {
        streams: 1,
        demand: 4.0,
    };
    assert!(over_rate(10.0, &[Some(6.5)], rest));
    assert!(over_rate(0.0, &[Some(1.0)], none), "no rate: over");
    assert!(over_rate(10.0, &[], none), "no stream: over");
}

#[test]
fn a_rate_under_one_a_second_loses_least_over_up_to_ten_seconds() {
    let room = Room {
        now: 100,
        rate: 1.0,
        until_ms: 0,
        over: 0,
        drain: 1.0,
        short: false,
        epoch: None,
    };
    // 0.84 a second: 5 every 6 s (0.83), not 4 every 5 s (0.8) nor 1 every 2 s.
    assert_eq!(assign(&room, 0.84, TTL).strategy, bucket(84, 5, 6).strategy);
    // 0.5: 1 every 2 s, the shortest of equals.
    assert_eq!(assign(&room, 0.5, TTL).strategy, bucket(50, 1, 2).strategy);
    // Under a token in 10 s: one token per the whole seconds that take one.
    assert_eq!(assign(&room, 0.1, TTL).strategy, bucket(10, 1, 10).strategy);
    assert_eq!(assign(&room, 0.05, TTL).strategy, bucket(5, 1, 20).strategy);
}
