//! `USE_STATSD`: the reference's per-rule counters reach a statsd socket as deltas, its
//! request counters and errors too, and the response-time timer as sampled lines.

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
    // An invalid request: the reference's `service_error`.
    let empty = RateLimitRequest {
        domain: String::new(),
        ..req.clone()
    };
    assert!(c.should_rate_limit(empty).await.is_err());
    // Read datagrams until the counters add up (bounded: a flush every 50 ms).
    let (mut total, mut over, mut requests, mut loads) = (0, 0, 0, 0);
    let (mut timed, mut errors) = (0.0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = vec![0u8; 2048];
    while (total, over, requests, loads, timed, errors) != (3, 1, 4, 1, 4.0, 1) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, sink.recv(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "got {total} hits, {over} over, {requests} requests, {loads} loads, \
                     {timed} timed, {errors} errors"
                )
            })
            .unwrap();
        for line in std::str::from_utf8(&buf[..n]).unwrap().lines() {
            let (name, rest) = line.split_once(':').unwrap();
            if name == "ratelimit_server.ShouldRateLimit.response_time" {
                // `<ms>|ms`, or `<ms>|ms|@<rate>` for 1/rate calls in one bucket.
                let mut parts = rest.split('|');
                let ms: f64 = parts.next().unwrap().parse().unwrap();
                assert!(ms > 0.0 && ms <= 20_000.0, "{line}");
                assert_eq!(parts.next(), Some("ms"), "{line}");
                let rate = parts.next().map_or(1.0, |r| {
                    r.strip_prefix('@').unwrap().parse::<f64>().unwrap()
                });
                timed += (1.0 / rate).round();
                continue;
            }
            let n: u64 = rest.strip_suffix("|c").unwrap().parse().unwrap();
            match name {
                "ratelimit.service.rate_limit.s.k.total_hits" => total += n,
                "ratelimit.service.rate_limit.s.k.over_limit" => over += n,
                "ratelimit_server.ShouldRateLimit.total_requests" => requests += n,
                "ratelimit.service.config_load_success" => loads += n,
                "ratelimit.service.call.should_rate_limit.service_error" => errors += n,
                _ => {}
            }
        }
    }
    s.stop().await.unwrap();
}
