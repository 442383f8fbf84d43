//! Limits too small to share by estimates (`EXACT_BELOW`, 16 by default): on two real
//! replicas, the docs' own example (docs/global.md, "Running a fleet": 3 a day per user,
//! queries alternating between the replicas) admits exactly 3 of every user's requests.

use crate::common::procs::{query_in, spawn_sluice, two_replicas, Proc};
use crate::common::redis::RedisServer;
use crate::common::{http, repo};

/// The overall code of one `envoy-e2e` query for `user` through `p` (`POST /json`).
fn overall(p: &Proc, user: &str) -> String {
    let v = query_in(p, "envoy-e2e", ("user", user));
    v["overallCode"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_limit_of_three_a_day_on_two_replicas_admits_exactly_three() {
    let redis = RedisServer::start();
    let replicas = two_replicas(&redis.url());
    // /rlconfig shows the rule decided exactly.
    let (_, _, config) = http(replicas[0].http, "GET", "/rlconfig", "", &[]).unwrap();
    assert!(
        config
            .lines()
            .any(|l| l.starts_with("envoy-e2e.user") && l.contains("exact: true")),
        "{config}"
    );
    // Six users, five queries each, alternating between the replicas with no pause: the
    // first three admitted, the rest refused, whichever replica answers.
    for user in ["ann", "bob", "cat", "dan", "eve", "fay"] {
        let codes: Vec<String> = (0..5).map(|i| overall(&replicas[i % 2], user)).collect();
        assert_eq!(
            codes,
            ["OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT"],
            "user {user}"
        );
    }
}

#[test]
fn exact_below_0_shares_a_small_limit_by_estimates() {
    let redis = RedisServer::start();
    let rules = repo().join("config/rules");
    let p = spawn_sluice(&rules, &redis.url(), &[("EXACT_BELOW", "0")]);
    let (_, _, config) = http(p.http, "GET", "/rlconfig", "", &[]).unwrap();
    assert!(
        config
            .lines()
            .any(|l| l.starts_with("envoy-e2e.user") && !l.contains("exact: true")),
        "{config}"
    );
}
