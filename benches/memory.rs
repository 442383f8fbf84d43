//! Memory per tracked entity (issue 10's bound: ≤ 200 bytes at 1M entities in local mode,
//! ≤ 250 in global mode), measured as a user sees it: the growth of the process's resident
//! set while the limiter tracks 1M distinct values, each sent once, divided by 1M. Window and
//! bucket rules, local and global mode (the sync against a store that keeps nothing, so its
//! memory is the limiter's only); each case in a process of its own, so none reuses memory
//! another freed. `cargo bench --bench memory`.

use std::process::Command;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::core::clock::{Clock, ManualClock, UnixMillis};
use sluice::core::table::EntityTable;
use sluice::core::SyncPolicy;
use sluice::global::{
    self, new_replica_id, Answer, Beat, Fleet, Global, Heartbeat, Others, Parts, ShardStore,
    StoreError, Stores, SyncConfig, SyncItem, SyncOp, SyncQueues, SyncSettings, Trip,
};
use sluice::rls::{GlobalMode, Options, RateLimiter};
use sluice::rules::RuleSet;
use sluice::telemetry::Telemetry;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

const ENTITIES: usize = 1_000_000;
const CASES: [&str; 4] = [
    "local window",
    "local bucket",
    "global window",
    "global bucket",
];

/// Resident set size in bytes, from /proc/self/statm (pages × 4 KiB).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A store that keeps nothing: every counter reads 0, every bucket full, the replica alone.
struct NullStore;

impl NullStore {
    async fn sync(&self, _: u64, items: &[SyncItem]) -> Result<Vec<[u64; 2]>, StoreError> {
        Ok(items
            .iter()
            .map(|i| match i.op {
                SyncOp::Window { .. } => [0, 0],
                SyncOp::Bucket { .. } => [0, 0],
            })
            .collect())
    }

    async fn heartbeat(&self, _: &Heartbeat) -> Result<Beat, StoreError> {
        Ok(Beat {
            live: 1,
            generation: None,
            resets: None,
        })
    }
}

impl ShardStore for NullStore {
    fn name(&self) -> &str {
        "null"
    }
    async fn round_trip(&self, replica: u64, trip: Trip<'_>) -> Result<Answer, StoreError> {
        // Publishes nothing and finds no one else: a store of one replica.
        global::sync::in_steps(
            trip,
            |items| self.sync(replica, items),
            |beat| self.heartbeat(beat),
            |p| async move { Ok(vec![Others::default(); p.items.len()]) },
        )
        .await
    }
    async fn time_ms(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

/// Lets the sync task run until the queue is empty (a second at most: a bench never hangs).
async fn drained(queues: &SyncQueues) {
    for _ in 0..1000 {
        if queues.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

fn measure(case: &str) {
    let clock = ManualClock::new(UnixMillis(1_700_000_040_000));
    let rules = rules_for(case);
    let telemetry = Arc::new(Telemetry::new().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // Built once and handed down, as the service's wiring does: the limiter on the table,
    // the fleet and the queues, then global mode handed the same.
    let table = EntityTable::new(Options::default().cache);
    let fleet = Arc::new(Fleet::new(new_replica_id()));
    let opened = case.starts_with("global").then(|| {
        let config = sync_config();
        let stores = Stores::one(Arc::new(NullStore));
        let queues = stores.queues(&config);
        (config, stores, queues)
    });
    let queues = opened.as_ref().map(|(_, _, queues)| queues.clone());
    let limiter = RateLimiter::new(
        rules,
        vec![],
        Arc::new(clock.clone()),
        Options::default(),
        telemetry.clone(),
        table.clone(),
        queues.clone().map(|queues| GlobalMode {
            queues,
            fleet: fleet.clone(),
            exact: None,
        }),
    );
    let _global = opened.map(|(config, stores, queues)| {
        let parts = Parts {
            table,
            fleet,
            queues,
            presence: None,
        };
        start_global(&rt, &clock, &telemetry, (config, stores), parts)
    });
    let (before, after) = track_every_value(&limiter, &clock, queues.as_deref(), &rt);
    // The default bound is 1M: the value sent before the measure made room for the last.
    assert_eq!(
        limiter.entity_count(),
        ENTITIES as u64,
        "every value tracked"
    );
    println!(
        "{case}: {ENTITIES} entities, RSS grew {:.1} MiB, {:.0} bytes per entity (bound: {})",
        (after - before) as f64 / (1024.0 * 1024.0),
        (after - before) as f64 / ENTITIES as f64,
        if case.starts_with("local") { 200 } else { 250 }
    );
    let _ = clock.now();
}

/// The case's one rule on `user`: a token bucket or a minute window.
fn rules_for(case: &str) -> RuleSet {
    let rule = if case.ends_with("bucket") {
        "{algorithm: token_bucket, unit: second, requests_per_unit: 10, burst: 100}"
    } else {
        "{unit: minute, requests_per_unit: 100}"
    };
    let yaml = format!("domain: m\ndescriptors:\n  - key: user\n    rate_limit: {rule}\n");
    sluice::rules::compile_sources(&[("rules.yaml".into(), yaml)], false).unwrap()
}

/// The sync's settings: a tick every millisecond (of real time), so that the queue drains
/// whenever the bench lets the runtime run.
fn sync_config() -> SyncConfig {
    let settings = SyncSettings {
        policy: SyncPolicy {
            tick_ms: 1,
            ..SyncPolicy::default()
        },
        ..SyncSettings::default()
    };
    SyncConfig::new(settings, 1_000_000)
}

/// Global mode as the service starts it, on a store that keeps nothing.
fn start_global(
    rt: &Runtime,
    clock: &ManualClock,
    telemetry: &Arc<Telemetry>,
    (config, stores): (SyncConfig, Stores<NullStore>),
    parts: Parts,
) -> Global {
    rt.block_on(global::spawn(
        config,
        stores,
        parts,
        Arc::new(clock.clone()),
        telemetry,
        CancellationToken::new(),
    ))
}

/// Sends each of the `ENTITIES` values once (after one sent before the measure), the sync
/// draining the queue as it goes; the resident set before and after.
fn track_every_value(
    limiter: &RateLimiter,
    clock: &ManualClock,
    queues: Option<&SyncQueues>,
    rt: &Runtime,
) -> (u64, u64) {
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
        if v % 10_000 == 0 {
            // The sync drains the queue, as a running service's does; 1 ms of time.
            clock.advance_ms(1);
            if let Some(q) = queues {
                rt.block_on(drained(q));
            }
        }
    }
    if let Some(q) = queues {
        rt.block_on(drained(q));
    }
    (before, rss())
}

fn main() {
    if let Ok(case) = std::env::var("SLUICE_MEMORY_CASE") {
        measure(&case);
        return;
    }
    let exe = std::env::current_exe().expect("the bench's own path");
    for case in CASES {
        let status = Command::new(&exe)
            .env("SLUICE_MEMORY_CASE", case)
            .status()
            .expect("the bench runs itself");
        assert!(status.success(), "{case} failed");
    }
    println!(
        "LimitState: {} bytes per limit",
        std::mem::size_of::<sluice::core::LimitState>()
    );
}
