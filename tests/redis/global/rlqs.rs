//! The quota service in global mode: reported usage reaches Redis through the sync, and
//! shutdown ends the quota streams only after the final flush has sent it (a stream ended
//! before would let its Envoy reconnect to a replica that cannot see those hits yet).

use crate::common::redis::{global_mode, RedisServer};
use crate::common::rlqs::{open, report, usage};
use crate::common::{wait_until_async, Server};

use super::{counters, RULES};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_ends_quota_streams_after_the_final_flush() {
    let redis = RedisServer::start();
    let server = Server::start(RULES, |s| {
        global_mode(vec![redis.url()], false, 2)(s);
        // A slow cadence, so the last report's hits reach Redis only by the final flush.
        s.sync.policy = sluice::core::SyncPolicy {
            tick_ms: 1000,
            base_ms: 60_000,
        };
        s.sync.timeout = std::time::Duration::from_secs(5);
    })
    .await;
    let mut q = open(server.grpc).await.unwrap();
    assert!(q
        .ask(report("g", vec![usage("k", "a", 7, Some(0))]))
        .await
        .unwrap()
        .is_some());
    wait_until_async(30, "the first report's 7 hits in Redis", || async {
        counters(&redis).0 == 7
    })
    .await;
    // Taken once answered: the room fell from 93 to 43, a new share.
    assert!(q
        .ask(report("g", vec![usage("k", "a", 50, Some(1))]))
        .await
        .unwrap()
        .is_some());
    // Redis holds writes for a second (past the Redis client's own default response timeout
    // of 500 ms, which sluice turns off in favour of REDIS_TIMEOUT, 5 s here): the final
    // flush waits, and so must the stream's end.
    redis.cli(&["CLIENT", "PAUSE", "1000", "WRITE"]);
    let stopped = tokio::spawn(server.stop());
    loop {
        match q.next().await {
            Ok(Some(_)) => continue,
            end => {
                assert!(matches!(end, Ok(None)), "ended with OK: {end:?}");
                break;
            }
        }
    }
    assert_eq!(
        counters(&redis).0,
        57,
        "when the stream ends, the final flush has sent every reported hit"
    );
    stopped.await.unwrap().unwrap();
}

/// The rate of a token-bucket assignment, tokens a second.
fn rate_of(r: &crate::common::rlqs::RateLimitQuotaResponse) -> f64 {
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
    match crate::common::rlqs::strategy(r) {
        Strategy::TokenBucket(t) => {
            f64::from(t.tokens_per_fill.unwrap().value) / t.fill_interval.unwrap().seconds as f64
        }
        other => panic!("not a token bucket: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn envoys_on_two_replicas_split_one_limit_through_the_presence_exchange() {
    const SHARED: &str = "domain: q\ndescriptors:\n  - key: t\n    rate_limit: {unit: minute, requests_per_unit: 600}\n";
    let redis = RedisServer::start();
    let a = Server::start(SHARED, global_mode(vec![redis.url()], false, 2)).await;
    let b = Server::start(SHARED, global_mode(vec![redis.url()], false, 2)).await;
    let (mut qa, mut qb) = (open(a.grpc).await.unwrap(), open(b.grpc).await.unwrap());
    // a's Envoy wants 10 a second, b's 40. Before a replica has heard of the other's stream,
    // it takes each other live replica to have as much as itself.
    // Reported as denied, so the demand shows and the room stays: the test may take as many
    // reports as the presence exchange needs without filling the window.
    let busy = |first: bool, per_5s: u64| {
        let mut u = usage("t", "x", 0, Some(if first { 0 } else { 5 }));
        u.num_requests_denied = per_5s;
        report("q", vec![u])
    };
    let alone = rate_of(&qa.ask(busy(true, 50)).await.unwrap().unwrap());
    let alone_b = rate_of(&qb.ask(busy(true, 200)).await.unwrap().unwrap());
    // The limit's 10 a second and the room handed back over 10 s (60 a second) make 70. Once
    // a has heard of b's stream and its demand (a presence tick, 50 ms here), a's Envoy gets
    // its 10 and half of what the two leave: 20. Alone it would get all 70, and taking b as a
    // mirror of itself (10 a second), 35: only the exchange gives 20.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut rates = (alone, alone_b);
    while rates.0 > 21.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a never heard of b's Envoy: {rates:?} (first {alone}, {alone_b})"
        );
        // A report is answered only when a share moved (or a refresh moves it later): take
        // whatever comes within a second, keeping the last of each.
        for (q, rate, per_5s) in [(&mut qa, &mut rates.0, 50), (&mut qb, &mut rates.1, 200)] {
            q.tx.send(busy(false, per_5s)).await.unwrap();
            let wait = std::time::Duration::from_secs(1);
            while let Ok(answer) = tokio::time::timeout(wait, q.rx.message()).await {
                *rate = rate_of(&answer.unwrap().expect("the stream stays open"));
            }
        }
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
