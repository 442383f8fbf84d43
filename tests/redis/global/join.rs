//! Replicas joining the fleet, on real processes and a real Redis: two started together and
//! hit by a surge on a new value as soon as both are ready; one whose Redis does not answer
//! at start.

use std::time::Duration;

use super::fleet::{surge_at_the_edge, EDGE_RULES};
use crate::common::free_port;
use crate::common::http;
use crate::common::procs::{spawn_sluice, spawn_sluice_unready, wait_ready, MEASURING};
use crate::common::redis::RedisServer;
use tokio::time::Instant;

/// What `p`'s heartbeats count (`sluice_sync_live_replicas`).
fn live(p: &crate::common::procs::Proc) -> String {
    let (_, _, body) = http(p.http, "GET", "/metrics", "", &[]).unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("sluice_sync_live_replicas "))
        .unwrap_or("none")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_started_together_count_each_other_before_a_surge_reaches_them() {
    let _measuring = MEASURING.lock().await;
    // Two replicas started at the same moment on one Redis, with the production tick (1 s),
    // then a value nobody has seen, on a rule of 600 an hour, gets 1,000 requests a second
    // in turn to each as soon as both are ready. Each reports ready only once the other
    // counted it, so both decide on a prior of half the limit (and 5 %) from the first hit.
    // Before replicas joined the fleet at start, the first one counted itself alone until
    // its next tick and the fleet admitted up to 1.27× the limit (the simulator, on the
    // same setting: `start together, 2 nodes`).
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), EDGE_RULES).unwrap();
    let env = [("SYNC_TICK", "1s"), ("SYNC_INTERVAL", "2s")];
    let fleet = tokio::task::block_in_place(|| {
        let fleet = [
            spawn_sluice_unready(dir.path(), &redis.url(), &env),
            spawn_sluice_unready(dir.path(), &redis.url(), &env),
        ];
        fleet.iter().for_each(wait_ready);
        fleet
    });
    let counted: Vec<String> = fleet.iter().map(live).collect();
    // 3 s of the surge (5× the limit): the limit is reached in its first second.
    let start = Instant::now() + Duration::from_millis(50);
    let admitted = surge_at_the_edge(&fleet, start, ("k", "together"), 3_000).await;
    assert_eq!(counted, ["2", "2"], "each counts both once both are ready");
    assert!(
        (540..=660).contains(&admitted),
        "admitted {admitted} of 600 (at most 1.10×, at least 0.90×)"
    );
}

#[test]
fn a_replica_whose_redis_does_not_answer_at_start_serves_and_says_so() {
    // Nothing listens on the port: the join gives up after its timeout, and the replica
    // starts all the same, deciding locally.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), EDGE_RULES).unwrap();
    let url = format!("127.0.0.1:{}", free_port());
    let p = spawn_sluice(dir.path(), &url, &[("SYNC_JOIN_TIMEOUT", "300ms")]);
    let (status, _, ready) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready.contains(
            "fleet: live replicas: 1 (started before Redis answered: nothing within 300ms"
        ),
        "{ready}"
    );
    let log = std::fs::read_to_string(p.log.path()).unwrap();
    assert!(log.contains("Redis did not answer at start"), "{log}");
}
