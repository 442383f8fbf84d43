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
    // Redis holds writes for 300 ms (under the Redis client's own 500 ms response
    // timeout): the final flush waits, and so must the stream's end.
    redis.cli(&["CLIENT", "PAUSE", "300", "WRITE"]);
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
