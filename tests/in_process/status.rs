//! `GET /status.json` on the real server, in process: its bounds crossed (more rules than it
//! lists), the quota streams it lists and forgets, reloads (the rules' lines found again, a
//! rejected load's errors), and what it tells the
//! page about `/top` for each admin-token setting. The page itself is tested in Chromium
//! (`tests/processes/status_page.rs`).

use serde_json::Value;

use crate::common::rlqs::{self, Quota};
use crate::common::{http_async, wait_until_async, Server};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10, name: per_tenant}\n";

async fn status(server: &Server) -> Value {
    let (code, _, body) = http_async(server.http, "GET", "/status.json", "")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn rules_past_the_bound_are_counted_not_listed() {
    let bound = sluice::server::status::MAX_STATUS_RULES;
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..=bound {
        yaml.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        ));
    }
    let server = Server::start(&yaml, |_| {}).await;
    let s = status(&server).await;
    assert_eq!(s["rules"]["count"], bound + 1);
    assert_eq!(s["rules"]["listed"].as_array().unwrap().len(), bound);
    assert_eq!(s["rules"]["more"], 1);
    assert_eq!(s["mode"], "local");
    assert!(s.get("fleet").is_none());
    assert_eq!(s["shards"], serde_json::json!([]));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn quota_streams_are_listed_with_their_domain_and_buckets_until_they_close() {
    let server = Server::start(RULES, |_| {}).await;
    let s = status(&server).await;
    assert_eq!(s["rlqs"]["streams"], 0);
    assert_eq!(s["rlqs"]["listed"], serde_json::json!([]));
    let mut q: Quota = rlqs::open(server.grpc).await.unwrap();
    let usages = vec![
        rlqs::usage("tenant", "acme", 1, Some(0)),
        rlqs::usage("tenant", "globex", 1, Some(0)),
    ];
    q.ask(rlqs::report("edge", usages)).await.unwrap().unwrap();
    let s = status(&server).await;
    assert_eq!(s["rlqs"]["streams"], 1);
    assert_eq!(s["rlqs"]["buckets"], 2);
    let listed = &s["rlqs"]["listed"];
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["domain"], "edge");
    assert_eq!(listed[0]["buckets"], 2);
    assert_eq!(s["rlqs"]["streams_more"], 0);
    // No descriptor value of a bucket in it.
    let text = s.to_string();
    assert!(!text.contains("acme") && !text.contains("globex"), "{text}");
    drop(q);
    wait_until_async(10, "the closed stream to leave the listing", || async {
        status(&server).await["rlqs"]["listed"] == serde_json::json!([])
    })
    .await;
    server.stop().await.unwrap();
}

#[tokio::test]
async fn reloads_are_shown_the_rules_lines_follow_and_a_rejected_one_shows_its_errors() {
    let server = Server::start(RULES, |_| {}).await;
    let s = status(&server).await;
    assert_eq!(s["reload"]["ok"], true);
    assert_eq!(s["reload"]["loads"], 1);
    let source = s["rules"]["listed"][0]["source"].as_str().unwrap();
    assert!(source.ends_with("rules.yaml:3"), "{source}");
    // A reload that moves the rule a line down: its new line, not the last set's.
    std::fs::write(
        server.dir.path().join("rules.yaml"),
        format!("# moved\n{RULES}"),
    )
    .unwrap();
    wait_until_async(10, "the second load in /status.json", || async {
        status(&server).await["reload"]["loads"] == 2
    })
    .await;
    let s = status(&server).await;
    let source = s["rules"]["listed"][0]["source"].as_str().unwrap();
    assert!(source.ends_with("rules.yaml:4"), "{source}");
    std::fs::write(
        server.dir.path().join("rules.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .unwrap();
    wait_until_async(10, "the rejected reload in /status.json", || async {
        status(&server).await["reload"]["ok"] == false
    })
    .await;
    let s = status(&server).await;
    let errors = s["reload"]["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().contains("fortnight")),
        "{errors:?}"
    );
    assert!(s["reload"]["errors_since_unix_ms"].is_u64());
    assert_eq!(
        s["rules"]["listed"][0]["name"], "per_tenant",
        "still in force"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn top_is_off_without_a_token_token_with_one_and_open_when_reads_are_open() {
    let off = Server::start(RULES, |_| {}).await;
    assert_eq!(status(&off).await["top"], "off");
    off.stop().await.unwrap();
    let token = Server::start(RULES, |s| {
        s.admin_token = sluice::server::admin_token::AdminToken::new("t0ken");
    })
    .await;
    assert_eq!(status(&token).await["top"], "token");
    token.stop().await.unwrap();
    let open = Server::start(RULES, |s| {
        s.admin_token = sluice::server::admin_token::AdminToken::new("t0ken");
        s.admin_open_reads = true;
    })
    .await;
    assert_eq!(status(&open).await["top"], "open");
    open.stop().await.unwrap();
}
