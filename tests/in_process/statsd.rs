//! `USE_STATSD`: the reference's per-rule counters reach a statsd socket as deltas, its
//! request counters and errors too, and the response-time timer as sampled lines.

use std::time::Duration;

use tokio::time::Instant;

use crate::common::{desc, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::telemetry::statsd::StatsdSettings;

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

/// Reads statsd lines from `sink` and hands each to `each` until it returns true (10 s at
/// most: a flush every 50 ms).
async fn read_until(sink: &tokio::net::UdpSocket, mut each: impl FnMut(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = vec![0u8; 65_536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, sink.recv(&mut buf))
            .await
            .expect("the awaited statsd lines within 10 s")
            .unwrap();
        for line in std::str::from_utf8(&buf[..n]).unwrap().lines() {
            if each(line) {
                return;
            }
        }
    }
}

/// A limit override: any client may send one for a known domain, with values of its choice.
fn overriding(
    entries: &[(&str, &str)],
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    let mut d = desc(entries);
    d.limit = Some(
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 100,
            unit: 2, // MINUTE
        },
    );
    d
}

async fn statsd_server() -> (tokio::net::UdpSocket, Server) {
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
    (sink, s)
}

#[tokio::test]
async fn a_descriptor_value_cannot_forge_statsd_lines() {
    let (sink, s) = statsd_server().await;
    let mut c = s.client().await;
    let forged = "v:1|c\nratelimit.service.rate_limit.s.k.over_limit:1000000|c";
    c.should_rate_limit(RateLimitRequest {
        domain: "s".into(),
        descriptors: vec![overriding(&[("k", forged)])],
        hits_addend: 0,
    })
    .await
    .unwrap();
    read_until(&sink, |line| {
        // Every line is one `name:value|type[|@rate]`: the name holds no ':' or '|'.
        let (name, rest) = line.split_once(':').expect("name:value");
        assert!(
            !rest.contains(':') && rest.matches('|').count() <= 2,
            "a forged line: {line:?}"
        );
        assert_ne!(
            name, "ratelimit.service.rate_limit.s.k.over_limit",
            "{line:?}"
        );
        // The override's own counter, its name sanitized as the reference does.
        name.starts_with("ratelimit.service.rate_limit.s.k_v_1_c_")
            && name.ends_with(".total_hits")
            && rest == "1|c"
    })
    .await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn an_oversized_line_neither_repeats_nor_blocks_the_others() {
    let (sink, s) = statsd_server().await;
    let mut c = s.client().await;
    // A key of ~128 KB: past any datagram.
    let long = "x".repeat(4_000);
    let values: Vec<(String, String)> = (0..32).map(|j| (format!("e{j}"), long.clone())).collect();
    let entries: Vec<(&str, &str)> = values
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    c.should_rate_limit(RateLimitRequest {
        domain: "s".into(),
        descriptors: vec![overriding(&entries)],
        hits_addend: 0,
    })
    .await
    .unwrap();
    let k = RateLimitRequest {
        domain: "s".into(),
        descriptors: vec![desc(&[("k", "v")])],
        hits_addend: 0,
    };
    for _ in 0..3 {
        c.should_rate_limit(k.clone()).await.unwrap();
    }
    let (mut requests, mut hits) = (0, 0);
    let count = |line: &str, requests: &mut u64, hits: &mut u64| {
        let (name, rest) = line.split_once(':').unwrap();
        let n: u64 = rest.strip_suffix("|c").map_or(0, |n| n.parse().unwrap());
        match name {
            "ratelimit_server.ShouldRateLimit.total_requests" => *requests += n,
            "ratelimit.service.rate_limit.s.k.total_hits" => *hits += n,
            _ => {}
        }
    };
    read_until(&sink, |line| {
        count(line, &mut requests, &mut hits);
        requests >= 4 && hits >= 3
    })
    .await;
    assert_eq!(
        (requests, hits),
        (4, 3),
        "(total_requests, total_hits) sent"
    );
    // One more request: once its hit arrives, every request was sent exactly once.
    c.should_rate_limit(k.clone()).await.unwrap();
    read_until(&sink, |line| {
        count(line, &mut requests, &mut hits);
        assert!(
            requests <= 5,
            "total_requests sent again: {requests} for 5 requests"
        );
        hits == 4
    })
    .await;
    assert_eq!(requests, 5);
    s.stop().await.unwrap();
}
