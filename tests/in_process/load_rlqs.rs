//! `sluice load --rlqs` against the real server in process: every stream's reports are
//! taken, every bucket gets its assignment, and nothing fails.

use std::time::Duration;

use sluice::cli::load_rlqs::{run, IdTemplate, Plan, Summary};
use tonic::transport::Endpoint;

use crate::common::Server;

const RULES: &str = r"
domain: cpu
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
";

#[tokio::test]
async fn the_rlqs_load_reports_every_bucket_and_gets_their_assignments() {
    let server = Server::start(RULES, |_| {}).await;
    let mut channels = Vec::new();
    for _ in 0..3 {
        let endpoint = Endpoint::from_shared(format!("http://{}", server.grpc)).unwrap();
        channels.push(endpoint.connect().await.unwrap());
    }
    let plan = Plan {
        domain: "cpu".into(),
        id: IdTemplate::parse("user=v{i}").unwrap(),
        buckets: 50,
        streams: 3,
        rate: 3000,
        interval: Duration::from_millis(100),
    };
    // Each stream's reports are due at its phase (0, 33 or 66 ms) and every 100 ms after it:
    // four of them before 400 ms, whatever the machine's pace (late ones are sent at once).
    let s: Summary = run(channels, &plan, Duration::from_millis(400)).await;
    assert_eq!(s.errors, 0, "{s:?}");
    assert_eq!((s.reports, s.usages), (12, 600), "{s:?}");
    // 3,000 a second over 3 streams and 50 buckets: 2 per bucket per 100 ms, in 3 of the 4.
    assert_eq!(s.requests, 3 * 50 * 3 * 2, "{s:?}");
    assert!(
        s.actions >= 150,
        "each stream's first report gets each of its buckets an assignment: {s:?}"
    );
    server.stop().await.unwrap();
}
