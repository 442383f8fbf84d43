//! Tests of the arithmetic that keeps a fleet of streams within one room besides the split
//! itself: the cautious first grant, the tokens at once half by share and half even, the
//! unused room handed back as rate, and when a stream is young.

use std::time::Duration;

use super::*;

const TTL: Duration = Duration::from_secs(15);

fn room(now: u64, rate: f64) -> Room {
    Room {
        now,
        rate,
        until_ms: 100,
        over: 0,
        drain: rate,
        short: false,
        epoch: None,
    }
}

fn max_of(a: &Assignment) -> u32 {
    match a.strategy {
        Strategy::TokenBucket { max_tokens, .. } => max_tokens,
        other => panic!("not a token bucket: {other:?}"),
    }
}

fn rate_of(a: &Assignment) -> f64 {
    match a.strategy {
        Strategy::TokenBucket {
            tokens_per_fill,
            fill_interval_s,
            ..
        } => f64::from(tokens_per_fill) / f64::from(fill_interval_s),
        other => panic!("not a token bucket: {other:?}"),
    }
}

#[test]
fn a_first_grant_is_an_even_part_of_the_room_among_sharers_and_replicas() {
    assert_eq!(first_grant_cap(600, 1, 1), 600);
    assert_eq!(first_grant_cap(600, 5, 2), 60);
    // Never no token, whatever the ways.
    assert_eq!(first_grant_cap(3, 10, 3), 1);
    assert_eq!(first_grant_cap(0, 0, 0), 1);
    assert_eq!(first_grant_cap(u64::MAX, u64::MAX, u32::MAX), 1);
}

#[test]
fn capped_grants_keep_their_rate() {
    let a = assign_capped(&room(600, 10.0), 0.5, 0.5, 40, TTL);
    assert_eq!(max_of(&a), 40);
    assert!((rate_of(&a) - 5.0).abs() < 1e-9, "{a:?}");
    // A cap above the share changes nothing.
    assert_eq!(
        max_of(&assign_capped(&room(600, 10.0), 0.5, 0.5, 1000, TTL)),
        300
    );
}

#[test]
fn tokens_at_once_are_half_by_share_half_even_and_sum_within_the_room() {
    let fractions = [0.9, 0.05, 0.05];
    let burst = burst_fractions(&fractions, 4);
    // A fourth stream elsewhere in the fleet: the even part is a quarter.
    assert!((burst[0] - (0.9 + 0.25) / 2.0).abs() < 1e-12);
    assert!((burst[1] - (0.05 + 0.25) / 2.0).abs() < 1e-12);
    assert!(burst.iter().sum::<f64>() <= 1.0);
    let assigned = assign_split(&room(100, 10.0), &fractions, &burst, TTL, &[]);
    let tokens: u32 = assigned.iter().map(max_of).sum();
    assert!(tokens <= 100, "{assigned:?}");
    // The rate follows the rate's fractions, not the tokens'.
    assert!((rate_of(&assigned[0]) - 9.0).abs() < 1e-9, "{assigned:?}");
    assert_eq!(max_of(&assigned[1]), 15);
    // Fewer streams known than listed: the listed ones count.
    let b = burst_fractions(&[0.5, 0.5], 0);
    assert!((b[0] - 0.5).abs() < 1e-12);
    // The same fractions for both: as `assign_all`.
    let same = assign_split(&room(100, 10.0), &fractions, &fractions, TTL, &[]);
    assert_eq!(same, assign_all(&room(100, 10.0), &fractions, TTL));
}

#[test]
fn a_pressed_fleet_near_its_limit_keeps_every_stream_a_few_tokens() {
    // Fifty streams at 0.02 each of a window's last ten tokens: rounded down, most get
    // none, and each of those would be denied although the window has room and drains.
    let fractions = [0.02; 50];
    let calm = assign_split(&room(10, 10.0), &fractions, &fractions, TTL, &[]);
    let denied = calm
        .iter()
        .filter(|a| a.strategy == Strategy::DenyAll)
        .count();
    assert_eq!(denied, 40, "{calm:?}");
    // Pressed, every stream runs its share with MIN_PRESSED_TOKENS at once.
    let pressed = assign_split(
        &room(10, 10.0),
        &fractions,
        &fractions,
        TTL,
        &[MIN_PRESSED_TOKENS; 50],
    );
    for a in &pressed {
        assert_eq!(u64::from(max_of(a)), MIN_PRESSED_TOKENS);
        assert!((rate_of(a) - 0.2).abs() < 1e-9, "{a:?}");
    }
    // A larger share keeps its own; at the limit the floor stays (the window drains),
    // past it every stream is denied.
    let big = assign_split(
        &room(100, 10.0),
        &[0.5, 0.5],
        &[0.5, 0.5],
        TTL,
        &[MIN_PRESSED_TOKENS; 2],
    );
    assert_eq!(max_of(&big[0]), 50);
    let floors = [MIN_PRESSED_TOKENS; 50];
    let at = assign_split(&room(0, 10.0), &fractions, &fractions, TTL, &floors);
    assert!(at
        .iter()
        .all(|a| u64::from(max_of(a)) == MIN_PRESSED_TOKENS));
    let past = Room {
        over: 1,
        ..room(0, 10.0)
    };
    let none = assign_split(&past, &fractions, &fractions, TTL, &floors);
    assert!(
        none.iter().all(|a| a.strategy == Strategy::DenyAll),
        "{none:?}"
    );
    // Three for a stream running a bucket; one for a stream denied or new, whose next
    // bucket starts full.
    let bucket = assign(&room(100, 10.0), 0.5, TTL);
    assert_eq!(pressed_floor(Some(bucket)), MIN_PRESSED_TOKENS);
    assert_eq!(pressed_floor(Some(assign(&past, 0.5, TTL))), 1);
    assert_eq!(pressed_floor(None), 1);
}

#[test]
fn the_unused_room_comes_back_as_rate_over_catch_up_s() {
    let r = catch_up(&room(100, 10.0));
    assert_eq!(r.now, 100);
    assert!((r.rate - (10.0 + 100.0 / CATCH_UP_S)).abs() < 1e-12);
    // At the limit there is none.
    assert!((catch_up(&room(0, 10.0)).rate - 10.0).abs() < 1e-12);
}

#[test]
fn a_stream_is_young_until_its_second_rated_report() {
    let counts = Counts {
        allowed: 5,
        denied: 0,
    };
    let mut d = Demand::default();
    assert!(d.young());
    d.observe(counts, Duration::ZERO, UnixMillis::from_secs(0));
    assert!(d.young(), "a first report gives no rate");
    d.observe(counts, Duration::from_secs(5), UnixMillis::from_secs(5));
    assert!(d.young(), "one rate: its first may be a burst's");
    d.observe(counts, Duration::from_secs(5), UnixMillis::from_secs(10));
    assert!(!d.young());
}
