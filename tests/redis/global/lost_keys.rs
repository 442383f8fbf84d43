//! A Redis that lost the sync's keys, on real processes: two replicas counting on one Redis,
//! the Redis paused (its data kept: nothing to report), then replaced by an empty one on the
//! same port. Each replica counts the loss in `sluice_sync_store_resets_total`, logs it once,
//! notes it in `/readyz` while staying ready, and the count comes back from their memory.

use super::{counters, RULES};
use crate::common::procs::{query, spawn_sluice, wait_live, Proc};
use crate::common::redis::RedisServer;
use crate::common::{http, wait_until};

const LOGGED: &str = "store shard lost the sync's keys";

/// `p`'s `sluice_sync_store_resets_total` for the shard on `port`.
fn resets(p: &Proc, port: u16) -> u64 {
    let (_, _, body) = http(p.http, "GET", "/metrics", "", &[]).unwrap();
    let series = format!("sluice_sync_store_resets_total{{shard=\"redis://127.0.0.1:{port}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series}in:\n{body}"))
        .parse()
        .unwrap()
}

fn readyz(p: &Proc) -> (u16, String) {
    let (status, _, body) = http(p.http, "GET", "/readyz", "", &[]).unwrap();
    (status, body)
}

fn log(p: &Proc) -> String {
    std::fs::read_to_string(p.log.path()).unwrap()
}

#[test]
fn an_empty_redis_in_place_of_the_old_one_is_counted_logged_and_refilled() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), RULES).unwrap();
    let fleet = [
        spawn_sluice(dir.path(), &redis.url(), &[]),
        spawn_sluice(dir.path(), &redis.url(), &[]),
    ];
    fleet.iter().for_each(|p| wait_live(p, 2));
    let send = |hits: usize| {
        for i in 0..hits {
            let r = query(&fleet[i % 2], "lost");
            assert_eq!(r["overallCode"], "OK", "{r}");
        }
    };
    send(20);
    wait_until(30, "20 hits in Redis", || counters(&redis).0 == 20);
    // A fresh fleet wrote the generation and found nothing lost.
    assert_eq!(redis.cli(&["PTTL", "sluice:generation"]), "-1");
    assert_eq!(fleet.each_ref().map(|p| resets(p, port)), [0, 0]);

    // Redis stops answering for longer than the call timeout, its data kept: degraded and
    // back, and nothing lost.
    redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]);
    for p in &fleet {
        wait_until(30, "the shard degraded", || {
            readyz(p).1.contains("degraded")
        });
    }
    for p in &fleet {
        wait_until(30, "the shard back", || readyz(p).1.contains(": ok\n"));
    }
    assert_eq!(fleet.each_ref().map(|p| resets(p, port)), [0, 0]);

    // An empty Redis in its place: each replica's next heartbeat finds another generation.
    redis.restart();
    for p in &fleet {
        wait_until(30, "the loss counted", || resets(p, port) == 1);
    }
    for p in &fleet {
        let log = log(p);
        assert_eq!(log.matches(LOGGED).count(), 1, "one line per loss:\n{log}");
        let line = log.lines().find(|l| l.contains(LOGGED)).unwrap();
        assert!(
            line.contains("WARN")
                && line.contains(&format!("shard=redis://127.0.0.1:{port}"))
                && line.contains("restoring the counts from the replicas' memory"),
            "{line}"
        );
        let (status, body) = readyz(p);
        assert_eq!(status, 200, "still ready: {body}");
        assert!(
            body.contains(&format!(
                "redis shard redis://127.0.0.1:{port}: ok (lost the sync's keys 1 time(s) since start, last at "
            )),
            "{body}"
        );
    }
    // Each replica's next hit restates its part: the 20 are back, with the 2 new ones.
    send(2);
    wait_until(30, "the count back in Redis", || counters(&redis).0 == 22);

    // A replica started since knows only the new generation: nothing lost for it.
    let late = spawn_sluice(dir.path(), &redis.url(), &[]);
    wait_live(&late, 3);
    assert_eq!(resets(&late, port), 0);
    assert_eq!(fleet.each_ref().map(|p| resets(p, port)), [1, 1]);
}
