//! Fleets of `sluice` processes sharing one Redis, each measured against the simulator's
//! prediction for the same setting: a limit shared by three, Redis restarting empty, a burst
//! on a cold entity, a surge at the edge; and SIGTERM's final flush, a skewed clock.

use std::process::Command;
use std::time::Duration;

use super::{counters, RULES};
use crate::common::procs::{grpc_addr, query, spawn_sluice, wait_live, Proc, MEASURING};
use crate::common::redis::RedisServer;
use crate::common::{desc, http, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::core::{Algorithm, Limit};
use sluice::sim::{self, Load, Scenario};
use tokio::time::Instant;

#[test]
fn a_fleet_of_three_processes_shares_one_limit() {
    let _measuring = MEASURING.blocking_lock();
    // The bound comes from the simulator (the production request path and sync task on
    // simulated time), run on this test's setting: 3 replicas, a limit of 60 in a fixed
    // window, a 100 ms tick (sync interval 2 s), ~1 ms round trip, 240 hits (4×) spread
    // evenly over 3 s. The test uses a day-long window so no boundary falls inside it;
    // the simulator uses a minute, which behaves the same within its first 3 s.
    let scenario = processes(3, 60, 100, (3_000, 80.0), 11);
    let predicted = sim::run(&scenario).sluice[0].admitted as usize;
    assert!(
        (60..=63).contains(&predicted),
        "the simulator predicts {predicted}"
    );

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES.replace("100", "60")).unwrap();
    let fleet = fleet_of(3, dir.path(), &redis, &[("SYNC_INTERVAL", "2s")]);
    let mut admitted = 0;
    for i in 0..240 {
        let r = query(&fleet[i % 3], "shared");
        admitted += usize::from(r["overallCode"] == "OK");
        std::thread::sleep(Duration::from_millis(12));
    }
    // Tolerance: the prediction ± 5. Real processes add what the simulator does not model
    // (scheduling delays, HTTP latency, tick phases), worth a few hits at this rate; without
    // sync the fleet would admit 180, and a fleet that stopped early would fall below 55.
    assert!(
        admitted + 5 >= predicted && admitted <= predicted + 5,
        "admitted {admitted}, simulator predicts {predicted}, limit 60 across 3 replicas"
    );
}

#[test]
fn a_redis_that_restarts_empty_gets_the_fleets_count_back() {
    let _measuring = MEASURING.blocking_lock();
    // 3 replicas, a limit of 300 in a fixed window: 220 hits acknowledged, Redis killed and
    // restarted empty on the same port, then 400 more. The bound comes from the simulator on
    // this setting (as in the test above): a hit every 12 ms spread over the replicas, 220
    // of them, the store restarting empty in the pause, 400 more.
    let load = |from_ms, until_ms| Load {
        from_ms,
        until_ms,
        times_limit: 60_000.0 / 12.0 / 300.0,
        hot_share: None,
    };
    let scenario = Scenario {
        name: "3 processes, Redis restarts",
        nodes: 3,
        limit: Limit {
            requests_per_unit: 300,
            window_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        },
        tick_ms: 100,
        rtt_ms: 1,
        loads: vec![load(0, 220 * 12), load(5_000, 5_000 + 400 * 12)],
        outage: None,
        restart_at_ms: Some(4_000),
        departure: None,
        windows: 1,
        seed: 12,
        alternate: false,
        t0: sim::aligned_t0(60_000),
        phases: None,
        strict: false,
        starts: None,
    };
    let predicted = sim::run(&scenario).sluice[0].admitted as usize;
    assert!(
        (297..=306).contains(&predicted),
        "the simulator predicts {predicted}"
    );

    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES.replace("100", "300")).unwrap();
    let fleet = fleet_of(3, dir.path(), &redis, &[("SYNC_INTERVAL", "2s")]);
    let mut admitted = 0;
    let mut send = |hits: usize| {
        for i in 0..hits {
            let r = query(&fleet[i % 3], "restart");
            admitted += usize::from(r["overallCode"] == "OK");
            std::thread::sleep(Duration::from_millis(12));
        }
    };
    send(220);
    wait_until(30, "220 hits in Redis", || counters(&redis).0 == 220);
    redis.restart(); // no persistence: back empty, on the same port
    assert_eq!(counters(&redis).0, 0);
    send(400);
    // Tolerance: the prediction ± 6, as for the fleet above (measured: 299 and 301 for a
    // prediction of 301), so at most 1.04× the limit. Before key version 2 the restart lost
    // the 220 and this fleet admitted 523 (the simulator, then, predicted 522).
    assert!(
        admitted + 6 >= predicted && admitted <= predicted + 6 && admitted <= 312,
        "admitted {admitted}, simulator predicts {predicted}, limit 300 across 3 replicas"
    );
}

/// A fleet test's scenario: a fixed window of `rpu` a minute, `load` = (until ms, × limit).
fn processes(nodes: usize, rpu: u32, tick_ms: u64, load: (u64, f64), seed: u64) -> Scenario {
    let (until_ms, times_limit) = load;
    Scenario {
        name: "processes",
        nodes,
        limit: Limit {
            requests_per_unit: rpu,
            window_ms: 60_000,
            algorithm: Algorithm::FixedWindow,
        },
        tick_ms,
        rtt_ms: 1,
        loads: vec![Load {
            from_ms: 0,
            until_ms,
            times_limit,
            hot_share: None,
        }],
        outage: None,
        restart_at_ms: None,
        departure: None,
        windows: 1,
        seed,
        alternate: false,
        t0: sim::aligned_t0(60_000),
        phases: None,
        strict: false,
        starts: None,
    }
}

/// Starts `n` processes on `redis`; waits until each one's heartbeats count all of them.
fn fleet_of(
    n: u32,
    rules: &std::path::Path,
    redis: &RedisServer,
    env: &[(&str, &str)],
) -> Vec<Proc> {
    let fleet: Vec<Proc> = (0..n)
        .map(|_| spawn_sluice(rules, &redis.url(), env))
        .collect();
    fleet.iter().for_each(|p| wait_live(p, n));
    fleet
}

#[test]
fn a_burst_on_a_cold_entity_across_four_processes_admits_what_the_simulator_predicts() {
    let _measuring = MEASURING.blocking_lock();
    // The simulator on this test's setting: 4 replicas, a limit of 40 in a fixed window, a
    // 1 s tick, ~1 ms round trip, 80 hits (2×) on a cold entity within 100 ms. Each replica
    // keeps to its prior (1.05 × 40 / 4 = 10, too small for burst reads: `core/prior.rs`)
    // until its first reply is a tick old, so the fleet admits about the limit; before the
    // prior, each admitted its 20 (2.0×).
    let predicted: Vec<usize> = (1..=6)
        .map(|seed| processes(4, 40, 1_000, (100, 2.0 * 600.0), seed))
        .map(|s| sim::run(&s).sluice[0].admitted as usize)
        .collect();
    let (lo, hi) = (predicted.iter().min(), predicted.iter().max());
    let (lo, hi) = (*lo.unwrap(), *hi.unwrap());
    assert!(hi <= 44, "the simulator predicts {predicted:?}");

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES.replace("100", "40")).unwrap();
    let env = [("SYNC_TICK", "1s"), ("SYNC_INTERVAL", "2s")];
    let fleet = fleet_of(4, dir.path(), &redis, &env);
    let ok = |p: &Proc| {
        // 20 hits on each replica at once, a client thread each: well within a tick.
        (0..20)
            .filter(|_| query(p, "burst")["overallCode"] == "OK")
            .count()
    };
    let admitted: usize = std::thread::scope(|sc| {
        let clients: Vec<_> = fleet.iter().map(|p| sc.spawn(move || ok(p))).collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    // Tolerance: the simulator's range over six seeds ± 2 (it lands hits at random, this test
    // evenly; real processes add scheduling and HTTP delays). Without the prior: 80.
    assert!(
        admitted + 2 >= lo && admitted <= hi + 2,
        "admitted {admitted}, simulator predicts {predicted:?}, limit 40 across 4 replicas"
    );
}

#[test]
fn sigterm_flushes_every_counted_hit_for_the_others_to_see() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    // A tick of an hour: only the cold entity's early round trip (its first hit or two)
    // reaches Redis before the shutdown's final flush.
    let a = spawn_sluice(
        dir.path(),
        &redis.url(),
        &[("SYNC_TICK", "1h"), ("SYNC_INTERVAL", "1h")],
    );
    for _ in 0..30 {
        assert_eq!(query(&a, "flush")["overallCode"], "OK");
    }
    let early = counters(&redis).0;
    assert!(
        (1..=2).contains(&early),
        "{early} hits synced before shutdown"
    );
    // Another replica, running: the heartbeats count two.
    let b = spawn_sluice(dir.path(), &redis.url(), &[]);
    wait_live(&b, 2);
    let mut a = a;
    let status = Command::new("kill")
        .args(["-TERM", &a.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_until(15, "sluice exit", || a.child.try_wait().unwrap().is_some());
    assert_eq!(counters(&redis).0, 30, "the final flush sent every hit");
    // ...and removed A's heartbeat: B counts one at its next tick, not after A's TTL (3 h).
    wait_live(&b, 1);
    // B sees A's hits: 70 left of 100.
    query(&b, "flush"); // a first look; the fleet's count arrives with the next tick
    wait_until(30, "replica b to learn the count", || {
        let r = http(b.http, "POST", "/json", r#"{"domain":"g","descriptors":[{"entries":[{"key":"k","value":"flush"}],"hitsAddend":0}]}"#, &[]).unwrap().2;
        r.contains(r#""limitRemaining":69"#)
    });
}

#[test]
fn a_replica_with_a_skewed_clock_shares_the_fleets_windows() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("r.yaml"),
        "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}\n",
    )
    .unwrap();
    let honest = spawn_sluice(dir.path(), &redis.url(), &[]);
    let skewed = spawn_sluice(dir.path(), &redis.url(), &[("SLUICE_CLOCK_SKEW", "25s")]);
    let reset = |p: &Proc| -> i64 {
        let r = query(p, "t");
        r["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .trim_end_matches('s')
            .parse()
            .unwrap()
    };
    // Both replicas see the same window end, within the time between the two calls (plus
    // the rounding to whole seconds); uncorrected, the skewed one would be 25 s off. A pair
    // is asked again until both answers come within 2 s, so a stalled machine cannot pass
    // for a skewed clock; the allowance is then what that pair actually took.
    let mut pair = (0, 0, Duration::ZERO);
    wait_until(
        60,
        "both replicas answering within 2 s of each other",
        || {
            let started = Instant::now();
            let (a, b) = (reset(&honest), reset(&skewed));
            pair = (a, b, started.elapsed());
            pair.2 < Duration::from_secs(2)
        },
    );
    let (a, b, took) = pair;
    let allowed = 1 + took.as_secs_f64().ceil() as i64;
    let diff = (a - b).rem_euclid(60).min((b - a).rem_euclid(60));
    assert!(
        diff <= allowed,
        "honest {a}s, skewed {b}s, asked {took:?} apart"
    );
}

/// The rules of the surge at the edge: 600 an hour on `k`, `strict` by default, and on `l`
/// with `strict: false`.
pub(super) const EDGE_RULES: &str = "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 600}\n  - key: l\n    rate_limit: {unit: hour, requests_per_unit: 600, strict: false}\n";

/// Each replica's tick phase (ms within the 1 s tick, in Redis time): the score of its last
/// heartbeat, whose member is the replica id its log names.
fn tick_phases(fleet: &[Proc], redis: &RedisServer) -> Vec<u64> {
    let beats = redis.cli(&["ZRANGE", "sluice:replicas", "0", "-1", "WITHSCORES"]);
    let beats: Vec<&str> = beats.lines().map(str::trim).collect();
    fleet
        .iter()
        .map(|p| {
            let log = std::fs::read_to_string(p.log.path()).unwrap();
            let id = log
                .split("replica id replica=\"")
                .nth(1)
                .and_then(|rest| rest.get(..16))
                .unwrap_or_else(|| panic!("no replica id in the log:\n{log}"));
            let at = beats.iter().position(|m| *m == id).expect("its heartbeat");
            beats[at + 1].parse::<u64>().unwrap() % 1_000
        })
        .collect()
}

/// Redis `TIME`, in ms.
fn redis_now_ms(redis: &RedisServer) -> u64 {
    let t = redis.cli(&["TIME"]);
    let mut parts = t.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let (s, us) = (parts.next().unwrap(), parts.next().unwrap());
    s * 1_000 + us / 1_000
}

/// A surge's traffic at the edge: `count` hits of `key=value`, one a millisecond of real
/// time from `start`, in turn to each replica of `fleet` (gRPC, each request on a task of
/// its own, so a slow answer never delays the next). Returns the hits admitted.
pub(super) async fn surge_at_the_edge(
    fleet: &[Proc],
    start: Instant,
    (key, value): (&str, &str),
    count: usize,
) -> usize {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut clients = Vec::new();
    for p in fleet {
        let c = RateLimitServiceClient::connect(format!("http://{}", grpc_addr(p)));
        clients.push(c.await.unwrap());
    }
    let request = RateLimitRequest {
        domain: "g".into(),
        descriptors: vec![desc(&[(key, value)])],
        hits_addend: 0,
    };
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_millis(i as u64)).await;
        let (mut c, r) = (clients[i % fleet.len()].clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            c.should_rate_limit(r)
                .await
                .unwrap()
                .into_inner()
                .overall_code
                == 1
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    admitted
}

/// How far the real fleet's admitted hits may be from the simulator's prediction for the
/// same scenario and tick phases: 20 hits, 3.3 % of the limit. The prediction's own spread
/// over tick phases and seeds is 605–630 (a replica's share of a burst read binding a few
/// hits below its prior, `core/prior.rs`), and real processes add what the simulator does
/// not model (requests a millisecond late or early, gRPC and Redis latency); the race this
/// test guards against admitted 140–165 more than its prediction.
const EDGE_TOLERANCE: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surge_at_the_edge_on_two_processes_admits_what_the_simulator_predicts() {
    let _measuring = MEASURING.lock().await;
    // Issue 19, item 11: two replicas, a value nobody has seen on a rule of 600 an hour, ten
    // times that over 6 s: 1,000 requests a second alternating between the replicas, with
    // the production tick (1 s), `strict` by default (`k`) and `strict: false` (`l`). Each
    // replica keeps to its prior, 315, until its first reply is a tick old. The race: the
    // replica whose tick comes first in the surge settled on a read that missed the other's
    // hits since the other's last sync, and took its share of room already spent — the
    // fleet admitted 774 and 776 (1.29×) with `strict: false` when the other ticked 20 ms
    // after it. So the surge starts 20 ms before one replica's tick, the other's following
    // within half a tick, where the race was widest; the simulator runs with the same phases.
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), EDGE_RULES).unwrap();
    let env = [("SYNC_TICK", "1s"), ("SYNC_INTERVAL", "2s")];
    let fleet = tokio::task::block_in_place(|| fleet_of(2, dir.path(), &redis, &env));
    let mut failures = Vec::new();
    for (key, name) in [
        ("k", "edge surge, 2 nodes, strict"),
        ("l", "edge surge, 2 nodes"),
    ] {
        let phases = tokio::task::block_in_place(|| tick_phases(&fleet, &redis));
        let follows = (phases[1] + 1_000 - phases[0]) % 1_000;
        let (leader, lag) = if follows <= 500 {
            (0, follows)
        } else {
            (1, 1_000 - follows)
        };
        let mut sim_phases = vec![20 + lag; 2];
        sim_phases[leader] = 20;
        let scenario = Scenario {
            phases: Some(sim_phases),
            ..sim::scenarios()
                .into_iter()
                .find(|s| s.name == name)
                .unwrap()
        };
        // On a thread of its own: the simulator runs its own runtime.
        let predicted = std::thread::spawn(move || sim::run(&scenario).sluice[0].admitted);
        let predicted = predicted.join().unwrap() as usize;
        // The surge's start, in Redis time (which the replicas' clocks follow): 20 ms before a
        // tick of the leader's, at least 300 ms from now.
        let now = tokio::task::block_in_place(|| redis_now_ms(&redis));
        let read_at = Instant::now();
        let mut start = now - now % 1_000 + phases[leader] + 1_000 - 20;
        while start < now + 300 {
            start += 1_000;
        }
        let begin = read_at + Duration::from_millis(start - now);
        let admitted = surge_at_the_edge(&fleet, begin, (key, "surge"), 6_000).await;
        if admitted > 660 || admitted.abs_diff(predicted) > EDGE_TOLERANCE {
            failures.push(format!(
                "{name}: admitted {admitted} of 600 (phases {phases:?}, lag {lag} ms), the \
                 simulator predicts {predicted}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
