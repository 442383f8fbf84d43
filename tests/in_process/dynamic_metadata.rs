//! `RESPONSE_DYNAMIC_METADATA` over gRPC: the reference's shape (domain, descriptors, hits,
//! and the deep-merged rule `metadata` of the descriptors within their limits), quota
//! descriptors' `passedBackends` as Envoy AI Gateway reads them (and the overall code of its
//! quota groups), and nothing when it is off.

use crate::common::{desc, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, UInt64Value, Value};
use std::collections::HashMap;

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

/// Envoy AI Gateway's quota rules (`internal/ratelimit/translator`): one domain, a descriptor
/// per backend (`namespace/name`) and model, each with its buckets: a tenant's (a bucket
/// rule's header match, key and value alike) and the model's default; or, without bucket
/// rules, the limit on the model itself.
const AI_GATEWAY: &str = r#"
domain: ai-gateway-quota
descriptors:
  - key: backend_name
    value: ns/be
    descriptors:
      - key: model_name_override
        value: model-a
        descriptors:
          - key: rule-0-x-tenant|acme-match-0
            value: rule-0-x-tenant|acme-match-0
            quota_mode: true
            rate_limit: {unit: minute, requests_per_unit: 1}
          - key: rule-1-match--1
            value: rule-1-match--1
            quota_mode: true
            metadata: {name: model_a_default}
            rate_limit: {unit: minute, requests_per_unit: 100}
      - key: model_name_override
        value: model-b
        descriptors:
          - key: rule-0-match--1
            value: rule-0-match--1
            quota_mode: true
            metadata: {name: model_b}
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: backend_name
    value: ns/other
    descriptors:
      - key: model_name_override
        value: model-a
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: backend_name
    value: ns/plain
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// The request-time check AI Gateway sends: every candidate backend's buckets.
fn candidates() -> RateLimitRequest {
    let bucket = |backend: &str, model: &str, rule: &str| {
        let mut e = vec![("backend_name", backend), ("model_name_override", model)];
        if !rule.is_empty() {
            e.push((rule, rule));
        }
        desc(&e)
    };
    RateLimitRequest {
        domain: "ai-gateway-quota".into(),
        descriptors: vec![
            bucket("ns/be", "model-a", "rule-0-x-tenant|acme-match-0"),
            bucket("ns/be", "model-a", "rule-1-match--1"),
            bucket("ns/be", "model-b", "rule-0-match--1"),
            bucket("ns/other", "model-a", ""),
        ],
        hits_addend: 0,
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn values(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn object(fields: Vec<(&str, Value)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<HashMap<_, _>>(),
    }
}

fn nested(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}

/// The whole metadata of a response to [`candidates`]: its descriptors, the `metadata` name
/// given, and the `(backend, model)` pairs given as `passedBackends`.
fn expected(metadata: &str, passed: &[(&str, &str)]) -> Struct {
    let entries = |entries: &[&str]| {
        let entries = entries.iter().map(|e| string(e)).collect();
        nested(object(vec![("entries", values(entries))]))
    };
    let pair = |(backend, model): &(&str, &str)| {
        nested(object(vec![
            ("backend_name", string(backend)),
            ("model_name_override", string(model)),
        ]))
    };
    object(vec![
        ("domain", string("ai-gateway-quota")),
        (
            "descriptors",
            values(vec![
                entries(&[
                    "backend_name=ns/be",
                    "model_name_override=model-a",
                    "rule-0-x-tenant|acme-match-0=rule-0-x-tenant|acme-match-0",
                ]),
                entries(&[
                    "backend_name=ns/be",
                    "model_name_override=model-a",
                    "rule-1-match--1=rule-1-match--1",
                ]),
                entries(&[
                    "backend_name=ns/be",
                    "model_name_override=model-b",
                    "rule-0-match--1=rule-0-match--1",
                ]),
                entries(&["backend_name=ns/other", "model_name_override=model-a"]),
            ]),
        ),
        ("metadata", nested(object(vec![("name", string(metadata))]))),
        ("passedBackends", values(passed.iter().map(pair).collect())),
    ])
}

#[tokio::test]
async fn quota_descriptors_name_the_backends_with_quota_left() {
    let s = Server::start(AI_GATEWAY, |st| st.options.dynamic_metadata = true).await;
    let mut c = s.client().await;
    let r = c
        .should_rate_limit(candidates())
        .await
        .unwrap()
        .into_inner();
    // Every bucket has room: each backend/model pair once, in request order; the metadata of
    // the first descriptor that has some.
    assert_eq!(
        r.dynamic_metadata.expect("dynamic metadata"),
        expected(
            "model_a_default",
            &[
                ("ns/be", "model-a"),
                ("ns/be", "model-b"),
                ("ns/other", "model-a")
            ]
        )
    );
    // acme's bucket of model-a on ns/be (1 a minute) is over: that model is out of quota,
    // though its default bucket passed, so neither names it. The same model on another
    // backend still has room.
    let r = c
        .should_rate_limit(candidates())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32, "other models have room");
    assert_eq!(
        r.dynamic_metadata.expect("dynamic metadata"),
        expected("model_b", &[("ns/be", "model-b"), ("ns/other", "model-a")])
    );
    // Asked for that model alone, the request is refused, though its default bucket passed:
    // the model's group is out of quota, and no other group has room.
    let mut alone = candidates();
    alone.descriptors.truncate(2);
    let r = c.should_rate_limit(alone).await.unwrap().into_inner();
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert!(!m.fields.contains_key("passedBackends"), "{m:?}");
    // Without quota descriptors, no list, though a descriptor names a backend.
    let plain = RateLimitRequest {
        domain: "ai-gateway-quota".into(),
        descriptors: vec![desc(&[("backend_name", "ns/plain")])],
        hits_addend: 0,
    };
    let r = c.should_rate_limit(plain).await.unwrap().into_inner();
    let m = r.dynamic_metadata.expect("dynamic metadata");
    assert!(!m.fields.contains_key("passedBackends"), "{m:?}");
    s.stop().await.unwrap();
}
