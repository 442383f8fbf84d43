//! `GET /status.json` in global mode against a real Redis: the fleet (live replicas, this
//! replica's id) and each shard's health as the status page shows them, a shard that goes
//! down included.

use serde_json::Value;

use crate::common::redis::{global_mode, RedisServer};
use crate::common::{http_async, wait_until_async, Server};

const RULES: &str =
    "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

async fn status(s: &Server) -> Value {
    let (code, _, body) = http_async(s.http, "GET", "/status.json", "").await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_fleet_and_each_shards_health_as_it_changes() {
    let mut redis = RedisServer::start();
    let s = Server::start(RULES, global_mode(vec![redis.url()], false, 2)).await;
    wait_until_async(10, "the shard to be ok in /status.json", || async {
        status(&s).await["shards"][0]["ok"] == true
    })
    .await;
    let st = status(&s).await;
    assert_eq!(st["mode"], "global");
    assert_eq!(st["fleet"]["live"], 1);
    let id = st["fleet"]["replica_id"].as_str().unwrap();
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert!(
        st["fleet"]["join"]
            .as_str()
            .unwrap()
            .starts_with("fleet: live replicas: 1"),
        "{st}"
    );
    let shard = &st["shards"][0];
    assert_eq!(shard["name"], redis.url().as_str());
    assert_eq!(shard["status"], "ok");
    assert!(shard["last_success_unix_ms"].as_u64().unwrap() > 0);

    redis.kill();
    wait_until_async(20, "the shard to be degraded in /status.json", || async {
        status(&s).await["shards"][0]["ok"] == false
    })
    .await;
    let st = status(&s).await;
    let health = st["shards"][0]["status"].as_str().unwrap();
    assert!(health.starts_with("degraded: "), "{health}");
    assert_eq!(
        st["ready"], true,
        "a degraded shard does not make it unready"
    );
    s.stop().await.unwrap();
}
