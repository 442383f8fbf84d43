//! `USE_STATSD`: the reference's per-rule counters reach a statsd socket as deltas.

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::{desc, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::server::statsd::StatsdSettings;

#[tokio::test]
async fn the_references_counters_reach_statsd_as_deltas() {
    let sink = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sink.local_addr().unwrap().to_string();
    let rules = "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let s = Server::start(rules, |st| {
        st.statsd = Some(StatsdSettings {
            addr,
            flush: Duration::from_millis(50),
        })
    })
    .await;
    let mut c = s.client().await;
    let req = RateLimitRequest {
        domain: "s".into(),
        descriptors: vec![desc(&[("k", "v")])],
        hits_addend: 0,
    };
    for _ in 0..3 {
        c.should_rate_limit(req.clone()).await.unwrap();
    }
    // Read datagrams until the counters add up (bounded: a flush every 50 ms).
    let (mut total, mut over, mut requests, mut loads) = (0, 0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = vec![0u8; 2048];
    while (total, over, requests, loads) != (3, 1, 3, 1) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, sink.recv(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!("got {total} hits, {over} over, {requests} requests, {loads} loads")
            })
            .unwrap();
        for line in std::str::from_utf8(&buf[..n]).unwrap().lines() {
            let (name, rest) = line.split_once(':').unwrap();
            let n: u64 = rest.strip_suffix("|c").unwrap().parse().unwrap();
            match name {
                "ratelimit.service.rate_limit.s.k.total_hits" => total += n,
                "ratelimit.service.rate_limit.s.k.over_limit" => over += n,
                "ratelimit_server.ShouldRateLimit.total_requests" => requests += n,
                "ratelimit.service.config_load_success" => loads += n,
                _ => {}
            }
        }
    }
    s.stop().await.unwrap();
}
