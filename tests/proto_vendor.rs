//! The descriptor set served by reflection is the one the vendored protos compile to.

mod common;

use std::process::Command;

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
