//! The vendored protos: the descriptor set served by reflection is the one they compile to,
//! and the xDS resource sluice decodes with envoy-types' types is the one vendored.

use std::process::Command;

use crate::common;

#[test]
fn descriptor_set_matches_the_vendored_protos() {
    common::require_tool("python3", "apt-get install python3");
    let out = tempfile::tempdir().unwrap();
    let bin = out.path().join("set.bin");
    let status = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I.", "--include_imports"])
        .arg(format!("--descriptor_set_out={}", bin.display()))
        .arg("envoy/service/ratelimit/v3/rls.proto")
        .current_dir(common::repo().join("proto-vendor"))
        .status()
        .unwrap();
    assert!(status.success(), "grpc_tools.protoc failed: install it with `pip install grpcio-tools` (scripts/test.sh does)");
    assert!(
        std::fs::read(&bin).unwrap() == sluice::server::grpc::FILE_DESCRIPTOR_SET,
        "proto-vendor/rls_descriptor_set.bin is stale: run proto-vendor/regen.sh"
    );
}

/// The vendored `rls_conf.proto` (the xDS resource) and the Rust types sluice decodes it with
/// (envoy-types') agree field by field: a message with every field set, encoded in Rust, reads
/// back through the vendored proto (Python's protobuf, compiled by grpc_tools' protoc) as the
/// expected JSON, and the same JSON encoded there decodes in Rust to the same message.
#[test]
fn the_rate_limit_config_types_match_the_vendored_proto() {
    use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
    use envoy_types::pb::ratelimit::config::ratelimit::v3 as rl;
    use prost::Message as _;

    common::require_tool("python3", "apt-get install python3");
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let message = rl::RateLimitConfig {
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
    };
    let expected = r#"{"descriptors": [{"descriptors": [{"key": "inner"}], "detailed_metric": true, "key": "k", "metadata": {"l": ["y"], "s": "x"}, "quota_mode": true, "rate_limit": {"name": "p", "replaces": [{"name": "q"}], "requests_per_unit": 7, "unit": "WEEK", "unlimited": true}, "shadow_mode": true, "value": "v"}], "domain": "d", "name": "n"}"#;

    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I."])
        .arg(format!("--python_out={}", dir.path().display()))
        .arg("ratelimit/config/ratelimit/v3/rls_conf.proto")
        .current_dir(common::repo().join("proto-vendor"))
        .status()
        .unwrap();
    assert!(status.success(), "grpc_tools.protoc failed: install it with `pip install grpcio-tools` (scripts/test.sh does)");
    std::fs::write(dir.path().join("from_rust.bin"), message.encode_to_vec()).unwrap();
    std::fs::write(dir.path().join("expected.json"), expected).unwrap();
    let script = r#"
import json, sys
from google.protobuf import json_format
from ratelimit.config.ratelimit.v3 import rls_conf_pb2 as pb
m = pb.RateLimitConfig()
m.ParseFromString(open("from_rust.bin", "rb").read())
print(json.dumps(json_format.MessageToDict(m, preserving_proto_field_name=True), sort_keys=True))
e = json_format.Parse(open("expected.json").read(), pb.RateLimitConfig())
open("from_python.bin", "wb").write(e.SerializeToString())
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expected);
    let back =
        rl::RateLimitConfig::decode(&*std::fs::read(dir.path().join("from_python.bin")).unwrap())
            .unwrap();
    assert_eq!(back, message);
}
