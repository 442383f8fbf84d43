//! `POST /explain` in global mode against a real Redis: an exact rule's counts read from the
//! store by a read-only call, a shared rule's from this replica's estimate, and no Redis key
//! changed by any number of explanations.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::common::redis::{global_mode, RedisServer};
use crate::common::{http_async, wait_until_async, Server};

/// `x`: exact, 100 a minute; `n`: shared by the background sync, 1000 a minute.
const RULES: &str = "domain: g\ndescriptors:\n  - key: x\n    rate_limit: {unit: minute, requests_per_unit: 100, exact: true}\n  - key: n\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

const BOTH: &str = r#"{"domain":"g","descriptors":[{"entries":[{"key":"x","value":"a"}]},{"entries":[{"key":"n","value":"a"}]}]}"#;

/// The counters' keys (the sync's `sluice:v2:` and the exact rules' `sluice:x:`) with their
/// values as DUMP serializes them: the replicas' presence is left out, since heartbeats
/// rewrite it on their own.
fn counters(redis: &RedisServer) -> BTreeMap<String, String> {
    redis
        .cli(&["--scan"])
        .lines()
        .filter(|k| k.starts_with("sluice:v2:") || k.starts_with("sluice:x:"))
        .map(|k| (k.to_string(), redis.cli(&["DUMP", k])))
        .collect()
}

/// The values of the counter keys with `prefix`, as text (a hash's values, a string's value).
fn values(redis: &RedisServer, prefix: &str) -> Vec<String> {
    let keys = redis.cli(&["--scan"]);
    keys.lines()
        .filter(|k| k.starts_with(prefix))
        .flat_map(|k| match redis.cli(&["TYPE", k]).trim() {
            "hash" => redis
                .cli(&["HVALS", k])
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>(),
            _ => vec![redis.cli(&["GET", k]).trim().to_string()],
        })
        .collect()
}

async fn explain(s: &Server) -> Value {
    let (status, _, text) = http_async(s.http, "POST", "/explain", BOTH).await.unwrap();
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_exact_counts_from_the_store_and_changes_no_key() {
    let redis = RedisServer::start();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 2)).await;
    for _ in 0..3 {
        let (status, _, text) = http_async(s.http, "POST", "/json", BOTH).await.unwrap();
        assert_eq!(status, 200, "{text}");
    }
    // The exact hits are in the store at once; the shared ones once the sync has sent them.
    assert_eq!(values(&redis, "sluice:x:"), ["3"]);
    wait_until_async(10, "the sync to send the 3 hits", || async {
        values(&redis, "sluice:v2:").iter().any(|v| v == "3")
    })
    .await;
    let before = counters(&redis);
    assert_eq!(before.len(), 2, "{before:?}");
    for _ in 0..5 {
        let v = explain(&s).await;
        let (x, n) = (&v["descriptors"][0], &v["descriptors"][1]);
        assert_eq!(x["rule"]["exact"], "store", "{v}");
        assert_eq!(x["limits"][0]["count"], 3, "read from the store: {v}");
        assert!(n["rule"].get("exact").is_none(), "{v}");
        assert_eq!(n["limits"][0]["count"], 3, "this replica's view: {v}");
        assert_eq!(v["overall_code"], "OK");
    }
    assert_eq!(counters(&redis), before, "explanations changed a Redis key");
    // A real hit does change them: the comparison above can fail.
    http_async(s.http, "POST", "/json", BOTH).await.unwrap();
    assert_eq!(values(&redis, "sluice:x:"), ["4"]);
    assert_ne!(counters(&redis), before);
    s.stop().await.unwrap();
}
