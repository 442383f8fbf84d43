//! `RESPONSE_DYNAMIC_METADATA` over gRPC: the reference's shape (domain, descriptors, hits,
//! and the deep-merged rule `metadata` of the descriptors within their limits), and nothing
//! when it is off.

use crate::common::{desc, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value};

const RULES: &str = r#"
domain: md
descriptors:
  - key: team
    metadata: {owner: {name: a, tier: gold}, tags: [x]}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plan
    metadata: {owner: {name: b, region: eu}, plan: pro}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    metadata: {never: merged}
    rate_limit: {unlimited: true}
"#;

fn get<'a>(s: &'a Struct, path: &[&str]) -> &'a Kind {
    let mut v = s
        .fields
        .get(path[0])
        .unwrap_or_else(|| panic!("no {}", path[0]));
    for key in &path[1..] {
        let Some(Kind::StructValue(inner)) = &v.kind else {
            panic!("{key}: not in a struct")
        };
        v = inner.fields.get(*key).unwrap_or_else(|| panic!("no {key}"));
    }
    v.kind.as_ref().expect("a value")
}

fn text(k: &Kind) -> &str {
    match k {
        Kind::StringValue(s) => s,
        other => panic!("not a string: {other:?}"),
    }
}

fn list(k: &Kind) -> &[Value] {
    match k {
        Kind::ListValue(l) => &l.values,
        other => panic!("not a list: {other:?}"),
    }
}

#[tokio::test]
async fn the_reference_shape_with_the_metadata_of_descriptors_within_their_limits() {
    let s = Server::start(RULES, |st| st.options.dynamic_metadata = true).await;
    let mut c = s.client().await;
    let mut plan = desc(&[("plan", "p")]);
    plan.hits_addend = Some(UInt64Value { value: 1 });
    let mut over = desc(&[("k", "v")]);
    over.limit = Some(RateLimitOverride {
        requests_per_unit: 42,
        unit: 3,
    });
    let req = RateLimitRequest {
        domain: "md".into(),
        descriptors: vec![desc(&[("team", "t")]), plan, desc(&[("free", "f")]), over],
        hits_addend: 0,
    };
    let r = c.should_rate_limit(req.clone()).await.unwrap().into_inner();
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(get(&m, &["domain"])), "md");
    let descriptors = list(get(&m, &["descriptors"]));
    assert_eq!(descriptors.len(), 4);
    let Some(Kind::StructValue(first)) = &descriptors[0].kind else {
        panic!("a struct")
    };
    assert_eq!(
        text(&list(get(first, &["entries"]))[0].kind.clone().unwrap()),
        "team=t"
    );
    let Some(Kind::StructValue(second)) = &descriptors[1].kind else {
        panic!("a struct")
    };
    assert_eq!(get(second, &["hitsAddend"]), &Kind::NumberValue(1.0));
    let Some(Kind::StructValue(fourth)) = &descriptors[3].kind else {
        panic!("a struct")
    };
    assert_eq!(
        text(get(fourth, &["limit"])),
        "requests_per_unit:42 unit:HOUR"
    );
    assert!(!m.fields.contains_key("hitsAddend"), "the request's is 0");
    // Both limited descriptors passed: merged, the first one's values kept where they clash.
    assert_eq!(text(get(&m, &["metadata", "owner", "name"])), "a");
    assert_eq!(text(get(&m, &["metadata", "owner", "tier"])), "gold");
    assert_eq!(text(get(&m, &["metadata", "owner", "region"])), "eu");
    assert_eq!(text(get(&m, &["metadata", "plan"])), "pro");
    assert!(!get_struct(&m, "metadata").fields.contains_key("never"));

    // `plan` (1 a minute) is over now: its metadata is left out.
    let r = c.should_rate_limit(req).await.unwrap().into_inner();
    let m = r.dynamic_metadata.expect("dynamic metadata");
    let meta = get_struct(&m, "metadata");
    assert!(!meta.fields.contains_key("plan"));
    assert!(!get_struct(meta, "owner").fields.contains_key("region"));
    s.stop().await.unwrap();
}

fn get_struct<'a>(s: &'a Struct, key: &str) -> &'a Struct {
    match get(s, &[key]) {
        Kind::StructValue(inner) => inner,
        other => panic!("{key}: not a struct: {other:?}"),
    }
}

#[tokio::test]
async fn off_by_default() {
    let s = Server::start(RULES, |_| {}).await;
    let r = s
        .client()
        .await
        .should_rate_limit(RateLimitRequest {
            domain: "md".into(),
            descriptors: vec![desc(&[("team", "t")])],
            hits_addend: 3,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.dynamic_metadata, None);
    s.stop().await.unwrap();
}
