//! `Room`: a window's and a bucket's room, the rate a window may hand out, and when a limit
//! is exhausted, with the assignments a room so read gives.

use std::time::Duration;

use super::*;
use crate::rlqs::share::{assign, assign_all, Strategy};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn window(rpu: u32, window_ms: u64) -> Limit {
    Limit {
        requests_per_unit: rpu,
        window_ms,
        algorithm: Algorithm::SlidingWindow,
    }
}

fn bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval_s: u32) -> Strategy {
    Strategy::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval_s,
    }
}

const TTL: Duration = Duration::from_secs(15);

#[test]
fn a_window_room_is_the_limit_less_the_fleet_count_at_its_steady_rate() {
    let room = Room::window(&window(600, 60_000), 450, 0, 12_000);
    assert_eq!(room.now, 150);
    assert!(close(room.rate, 10.0));
    assert_eq!(
        room.until_ms, 100,
        "a sliding window drains a hit every 100 ms"
    );
    assert_eq!(Room::window(&window(600, 60_000), 900, 0, 1).now, 0);
    assert_eq!(Room::window(&window(600, 60_000), 900, 0, 40).until_ms, 40);
    let fixed = Limit {
        algorithm: Algorithm::FixedWindow,
        ..window(600, 60_000)
    };
    assert_eq!(
        Room::window(&fixed, 600, 0, 12_000).until_ms,
        12_000,
        "a fixed window waits for its reset"
    );
}

#[test]
fn a_bucket_room_is_its_tokens_up_to_its_burst_refilled_one_token_at_a_time() {
    let limit = Limit {
        requests_per_unit: 3,
        window_ms: 1000,
        algorithm: Algorithm::TokenBucket { burst: 20 },
    };
    // Owing nothing: full; owing 50 of a burst of 20: empty, 30 past it.
    let full = Room::bucket(&limit, 0);
    assert_eq!((full.now, full.over), (20, 0));
    let room = Room::bucket(&limit, 50);
    assert_eq!((room.now, room.over), (0, 30));
    assert!(close(room.rate, 3.0));
    assert_eq!(room.until_ms, 334);
    // 20 tokens at 3 a second refill in under 7 s: longer than a report interval.
    assert!(!room.short);
}

#[test]
fn a_window_hands_out_no_more_rate_than_it_drains_and_its_room_over_a_report() {
    let limit = window(600, 60_000);
    // A first epoch (nothing drains) with 20 left: 4 a second, not the steady 10.
    let cold = Room::window(&limit, 580, 0, 30_000);
    assert!(close(cold.absorbs(), 4.0));
    assert_eq!(assign(&cold, 1.0, TTL).strategy, bucket(20, 4, 1));
    // A previous epoch of 600 drains 10 a second: that and the room's part.
    let warm = Room::window(&limit, 580, 600, 30_000);
    assert!(close(warm.absorbs(), 14.0));
    // A short limit's streams' rates are what hold it: no cap.
    let short = Room::window(&window(50, 1_000), 50, 0, 500);
    assert!(short.absorbs().is_infinite());
}

#[test]
fn a_short_limit_is_denied_only_past_a_reporting_interval_of_its_rate() {
    // 50 a second with a burst of one second: it refills within a report interval.
    let limit = Limit {
        requests_per_unit: 50,
        window_ms: 1000,
        algorithm: Algorithm::TokenBucket { burst: 50 },
    };
    let at_limit = Room::bucket(&limit, 50);
    assert!(at_limit.short && at_limit.now == 0);
    // At the limit, a stream keeps its rate and a second of it at once, its fill not held
    // to a capacity cut from the room.
    assert!(!at_limit.exhausted());
    assert_eq!(
        assign_all(&at_limit, &[0.5], TTL)[0].strategy,
        bucket(25, 25, 1)
    );
    // Fifty streams of a second's 1 token each hold MIN_SHORT_TOKENS at once, not 1.
    let fifty = assign_all(&at_limit, &[0.02; 50], TTL);
    assert!(
        fifty.iter().all(|a| a.strategy == bucket(3, 1, 1)),
        "{fifty:?}"
    );
    // Past the limit by more than five seconds of its rate: denied.
    let mut over = at_limit;
    over.over = 251;
    assert!(over.exhausted());
    assert_eq!(assign(&over, 0.5, TTL).strategy, Strategy::DenyAll);
    // A longer limit at no room is denied once past it, or when nothing drains (a fixed
    // window, a sliding window's first epoch); at it, its streams run what drains.
    let mut long = at_limit;
    long.short = false;
    assert!(!long.exhausted());
    assert_eq!(assign(&long, 0.5, TTL).strategy, bucket(1, 25, 1));
    let mut past = long;
    past.over = 1;
    assert!(past.exhausted());
    let mut still = long;
    still.drain = 0.0;
    assert!(still.exhausted());
}
