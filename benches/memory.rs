//! Memory per tracked entity (ARCHITECTURE.md, "Targets": ≤ 200 bytes at 1M entities), measured as the growth
//! of the process's resident set while the limiter tracks 1M distinct values, divided by 1M.
//! Prints the figure; `cargo bench --bench memory`.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::core::clock::{ManualClock, UnixMillis};
use sluice::rls::{Options, RateLimiter};

const ENTITIES: usize = 1_000_000;

/// Resident set size in bytes, from /proc/self/statm (pages × 4 KiB).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn main() {
    let yaml = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let clock = ManualClock::new(UnixMillis(1_700_000_040_000));
    let limiter = RateLimiter::local(yaml, Arc::new(clock), Options::default()).unwrap();
    // One request reused: only the value changes, so the request itself adds no memory.
    let mut req = RateLimitRequest {
        domain: "m".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: String::with_capacity(16),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let set = |req: &mut RateLimitRequest, v: usize| {
        let value = &mut req.descriptors[0].entries[0].value;
        value.clear();
        value.push_str(&format!("u{v}"));
    };
    set(&mut req, 0);
    limiter.should_rate_limit(&req).unwrap();
    let before = rss();
    for v in 0..ENTITIES {
        set(&mut req, v);
        limiter.should_rate_limit(&req).unwrap();
    }
    let after = rss();
    // moka counts lazily, so the divisor is the number of distinct values sent.
    println!(
        "{ENTITIES} entities tracked: RSS grew {:.1} MiB, {:.0} bytes per entity (target <= 200)",
        (after - before) as f64 / (1024.0 * 1024.0),
        (after - before) as f64 / ENTITIES as f64
    );
    println!(
        "WindowState: {} bytes per limit",
        std::mem::size_of::<sluice::core::WindowState>()
    );
}
