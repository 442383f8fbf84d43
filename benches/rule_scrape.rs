//! What the per-rule gauges (`sluice_rule_*`) and `GET /top` cost at scale: a `/metrics`
//! render and a `/top` answer with an empty table, then with `KEYS` tracked keys (10 million
//! by default), in local mode. The gauges are O(rules), so the render should not grow with
//! the keys; `/top` reads at most its candidates. Prints each median of 5.
//!
//! `KEYS=10000000 cargo bench --bench rule_scrape` (docs/performance.md has a run's figures;
//! `--profile dev` for a debug build, an upper bound).

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::core::clock::{ManualClock, UnixMillis};
use sluice::core::table::CacheSettings;
use sluice::rls::{Options, RateLimiter, TopQuery};
use tokio::time::Instant;

const RULES: &str = "domain: scrape
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}
";

/// The median of 5 runs of `f`, in milliseconds, and its last result.
fn median_ms<R>(mut f: impl FnMut() -> R) -> (f64, R) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let t = Instant::now();
        last = Some(f());
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    (times[2], last.expect("five runs"))
}

fn request(key: &str, value: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "scrape".into(),
        descriptors: vec![
            envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
                entries: vec![
                    envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry {
                        key: key.into(),
                        value: value.to_string(),
                    },
                ],
                ..Default::default()
            },
        ],
        hits_addend: 1,
    }
}

fn main() {
    let keys: u64 = std::env::var("KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let clock = ManualClock::new(UnixMillis(1_700_000_000_000));
    let opts = Options {
        cache: CacheSettings {
            max_entries: keys,
            ..CacheSettings::default()
        },
        ..Options::default()
    };
    let limiter = RateLimiter::local(RULES, Arc::new(clock), opts).expect("rules");
    let top = |l: &RateLimiter| {
        l.top(TopQuery {
            domain: None,
            rule: None,
            n: 1000,
        })
        .keys
        .len()
    };
    let (empty_ms, empty) = median_ms(|| limiter.telemetry().render());
    let (empty_top_ms, _) = median_ms(|| top(&limiter));
    let t = Instant::now();
    let threads = 2;
    std::thread::scope(|s| {
        for th in 0..threads {
            let limiter = &limiter;
            s.spawn(move || {
                let mut i = th;
                while i < keys {
                    let key = ["user", "tenant", "ip"][(i % 3) as usize];
                    // A few heavy keys per rule, so that some are near and over.
                    let hits = if i < 30 { 1200 } else { 1 };
                    for _ in 0..hits {
                        limiter.should_rate_limit(&request(key, i)).expect("valid");
                    }
                    i += threads;
                }
            });
        }
    });
    let fill_s = t.elapsed().as_secs_f64();
    let (full_ms, full) = median_ms(|| limiter.telemetry().render());
    let (full_top_ms, listed) = median_ms(|| top(&limiter));
    println!(
        "keys tracked: {} (filled in {fill_s:.0} s)",
        limiter.entity_count()
    );
    println!(
        "/metrics render: {empty_ms:.2} ms empty ({} bytes), {full_ms:.2} ms at {} keys ({} bytes): +{:.2} ms",
        empty.len(),
        limiter.entity_count(),
        full.len(),
        full_ms - empty_ms
    );
    println!("/top n=1000: {empty_top_ms:.2} ms empty, {full_top_ms:.2} ms full ({listed} keys)");
    for line in full.lines().filter(|l| l.starts_with("sluice_rule_")) {
        println!("  {line}");
    }
}
