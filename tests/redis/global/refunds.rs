//! More given back than was taken, across two in-process replicas on one real Redis: a
//! concurrency limit's releases (a retried or duplicated stream-done) and a budget's settles
//! (reserve, then settle) free only what was counted, fleet-wide, as local mode and
//! `exact: true` do. Before, Redis's count went below zero and the fleet admitted 20 of 40
//! where 10 places were free.

use std::time::Duration;

use super::status;
use crate::common::redis::{sync_mode, RedisServer};
use crate::common::{wait_for_body, Server};

/// Every `sluice:v2` counter's fields, summed by kind: hits (`<id>`), refunds as stated
/// (`<id>-`, negative) and refunds kept out (`<id>+`). Their sum is the count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Fields {
    hits: i64,
    stated: i64,
    kept: i64,
}

impl Fields {
    fn of(r: &RedisServer) -> Fields {
        let mut f = Fields::default();
        for key in r.cli(&["--scan", "--pattern", "*sluice:v2:{*"]).lines() {
            let all = r.cli(&["HGETALL", key]);
            let lines: Vec<&str> = all.lines().map(str::trim).collect();
            for pair in lines.chunks(2) {
                let v: i64 = pair[1].parse().unwrap();
                match pair[0].chars().last() {
                    Some('-') => f.stated += v,
                    Some('+') => f.kept += v,
                    _ => f.hits += v,
                }
            }
        }
        f
    }

    fn count(&self) -> i64 {
        self.hits + self.stated + self.kept
    }
}

/// Two replicas of a rule on key `c` with `limit`, on one Redis.
struct Fleet {
    servers: [Server; 2],
    limit: u32,
    /// Both replicas' clock, ms after `T0`.
    now_ms: std::cell::Cell<u64>,
}

impl Fleet {
    async fn start(rules: &str, redis: &RedisServer, limit: u32) -> Fleet {
        let a = Server::start(rules, sync_mode(vec![redis.url()], false, 2)).await;
        let b = Server::start(rules, sync_mode(vec![redis.url()], false, 2)).await;
        let fleet = Fleet {
            servers: [a, b],
            limit,
            now_ms: std::cell::Cell::new(0),
        };
        // A counted itself alone until its heartbeat met B's: on a loaded machine later than
        // B was ready. Both count two before the key's first request.
        for s in &fleet.servers {
            wait_for_body(s.http, "/metrics", "sluice_sync_live_replicas 2\n").await;
        }
        // The fleet formed before the key's first request, as time runs in a deployment:
        // with both clocks still at the start's instant, the key's first reply would share
        // it with the heartbeat reply that counted the second replica, which reads as a key
        // young when a replica joined (`core/window/prior.rs`), kept to an even share of
        // the room without spread (3 of B's 5 acquisitions admitted, not 5).
        fleet.second_on();
        fleet
    }

    /// Both clocks a second on: a key is due for a sync at the next tick whatever its
    /// pressure (the slowest tier's interval is 8 × 100 ms here).
    fn second_on(&self) {
        self.now_ms.set(self.now_ms.get() + 1_000);
        for s in &self.servers {
            s.clock
                .set(crate::common::T0.plus_millis(self.now_ms.get()));
        }
    }

    /// Waits until `cond` holds, both clocks moving a second at each look, so the replicas'
    /// next ticks sync the key.
    async fn until<F, Fut>(&self, what: &str, mut cond: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        // About 10 s: a tick (50 ms) between looks.
        for _ in 0..160 {
            if cond().await {
                return;
            }
            self.second_on();
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        panic!("timed out waiting for {what}");
    }

    /// Waits until both replicas report `free` places (a look: 0 hits).
    async fn read_by_both(&self, free: u64) {
        self.until(&format!("both replicas to read {free} free"), || async {
            for s in &self.servers {
                if u64::from(status(s, "c", "t", 0, false).await.1) != free {
                    return false;
                }
            }
            true
        })
        .await;
    }

    /// Each replica takes `held` in requests of `each`, and both read them. Then each gives
    /// back `back` in requests of `each` while Redis is paused, so each takes them off a
    /// view that holds every hit (as two releases of the same places racing through two
    /// replicas do), and the refunds reach Redis.
    async fn held_then_over_released(
        &self,
        redis: &RedisServer,
        (held, back, each): (u64, u64, u64),
    ) {
        for s in &self.servers {
            for _ in 0..held / each {
                assert!(
                    !status(s, "c", "t", each, false).await.0,
                    "within the limit"
                );
            }
        }
        let taken = 2 * held as i64;
        self.until("Redis to hold both replicas' hits", || async {
            Fields::of(redis).hits == taken
        })
        .await;
        self.read_by_both(u64::from(self.limit) - 2 * held).await;
        // No reply reaches either replica while both give back.
        redis.cli(&["CLIENT", "PAUSE", "400", "ALL"]);
        for _ in 0..back / each {
            for s in &self.servers {
                status(s, "c", "t", each, true).await;
            }
        }
        let stated = -2 * back as i64;
        self.until("Redis to hold both replicas' refunds", || async {
            Fields::of(redis).stated == stated
        })
        .await;
    }

    /// `n` requests of `each` hits, alternating between the replicas, each sent once Redis
    /// holds what the ones before admitted and both replicas have read it: how many were
    /// admitted.
    async fn admitted_in_turn(&self, redis: &RedisServer, n: usize, each: u64) -> usize {
        let mut admitted = 0;
        let hits_before = Fields::of(redis).hits;
        for i in 0..n {
            self.second_on();
            if !status(&self.servers[i % 2], "c", "t", each, false).await.0 {
                admitted += 1;
            }
            let hits = hits_before + (admitted as u64 * each) as i64;
            self.until("Redis to hold what was admitted", || async {
                Fields::of(redis).hits == hits
            })
            .await;
            let count = Fields::of(redis).count().max(0) as u64;
            self.read_by_both(u64::from(self.limit).saturating_sub(count))
                .await;
        }
        admitted
    }

    async fn stop(self) {
        for s in self.servers {
            s.stop().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_beyond_the_acquisitions_free_no_place_that_was_not_taken() {
    // 10 places; 5 held through each replica, then 10 released through each (a retried
    // stream-done): every place is free, none more. Of 40 acquisitions, exactly 10 fit.
    let rules = "domain: g\ndescriptors:\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: concurrency}\n";
    let redis = RedisServer::start();
    let fleet = Fleet::start(rules, &redis, 10).await;
    fleet.held_then_over_released(&redis, (5, 10, 1)).await;
    let f = Fields::of(&redis);
    assert_eq!(f.count(), 0, "no count below zero: {f:?}");
    let admitted = fleet.admitted_in_turn(&redis, 40, 1).await;
    assert_eq!(admitted, 10, "the 10 places, no more, no fewer");
    fleet.stop().await;
    assert_eq!(Fields::of(&redis).count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settles_beyond_the_reservations_give_back_no_budget_that_was_not_spent() {
    // A budget of 10 an hour, reserved then settled (docs/llm-budgets.md): 5 reserved through
    // each replica, 10 settled through each (more than was reserved). The whole budget is
    // back, no more: of 40 requests of 1, exactly 10 fit.
    let rules = "domain: g\ndescriptors:\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 10, strict: false}\n";
    let redis = RedisServer::start();
    let fleet = Fleet::start(rules, &redis, 10).await;
    fleet.held_then_over_released(&redis, (5, 10, 5)).await;
    let f = Fields::of(&redis);
    assert_eq!(f.count(), 0, "no count below zero: {f:?}");
    let admitted = fleet.admitted_in_turn(&redis, 40, 1).await;
    assert_eq!(admitted, 10, "the whole budget, no more, no less");
    fleet.stop().await;
    assert_eq!(Fields::of(&redis).count(), 10);
}
