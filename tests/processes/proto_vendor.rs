//! The vendored protos: the descriptor set served by reflection is the one they compile to,
//! and the xDS resource sluice decodes with envoy-types' types is the one vendored.

use std::path::Path;
use std::process::{Command, Output};

use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3 as rl;
use prost::Message as _;

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
    common::require_tool("python3", "apt-get install python3");
    let message = every_field_set();

    let dir = tempfile::tempdir().unwrap();
    compile_rls_conf_for_python(dir.path());
    let out = round_trip_through_python(dir.path(), &message);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), EXPECTED_JSON);
    let back =
        rl::RateLimitConfig::decode(&*std::fs::read(dir.path().join("from_python.bin")).unwrap())
            .unwrap();
    assert_eq!(back, message);
}

/// `every_field_set()` as the vendored proto's JSON (field names as in the proto, keys
/// sorted).
const EXPECTED_JSON: &str = r#"{"descriptors": [{"descriptors": [{"key": "inner"}], "detailed_metric": true, "key": "k", "metadata": {"l": ["y"], "s": "x"}, "quota_mode": true, "rate_limit": {"name": "p", "replaces": [{"name": "q"}], "requests_per_unit": 7, "unit": "WEEK", "unlimited": true}, "shadow_mode": true, "value": "v"}], "domain": "d", "name": "n"}"#;

/// A RateLimitConfig with every field of every message set (and a nested descriptor).
fn every_field_set() -> rl::RateLimitConfig {
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

/// rls_conf.proto compiled to Python modules in `dir`, by grpc_tools' protoc.
fn compile_rls_conf_for_python(dir: &Path) {
    let status = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I."])
        .arg(format!("--python_out={}", dir.display()))
        .arg("ratelimit/config/ratelimit/v3/rls_conf.proto")
        .current_dir(common::repo().join("proto-vendor"))
        .status()
        .unwrap();
    assert!(status.success(), "grpc_tools.protoc failed: install it with `pip install grpcio-tools` (scripts/test.sh does)");
}

/// Python reads `message` encoded in Rust and prints it as JSON, and encodes
/// `EXPECTED_JSON` to from_python.bin in `dir`.
fn round_trip_through_python(dir: &Path, message: &rl::RateLimitConfig) -> Output {
    std::fs::write(dir.join("from_rust.bin"), message.encode_to_vec()).unwrap();
    std::fs::write(dir.join("expected.json"), EXPECTED_JSON).unwrap();
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
    Command::new("python3")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap()
}
