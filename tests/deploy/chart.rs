//! The chart as a whole: `helm lint --strict`, values the schema or the templates refuse,
//! renders validated strictly against the Kubernetes 1.30 schemas, and the shipped example
//! rules passing `sluice check`.

use std::collections::BTreeMap;

use crate::manifests::{rendered_rules, sluice_container, str_at, Manifests};
use crate::tools::{
    all_on, helm_lint, helm_lint_bare, helm_template_bare, helm_template_run, render, sluice_check,
    validate_builtin_kinds,
};

fn assert_lints_clean(args: &[&str], what: &str) {
    let out = helm_lint(args);
    assert!(
        out.status.success(),
        "helm lint --strict {what} failed:\n{}",
        out.describe()
    );
    assert!(
        out.stdout.contains("0 chart(s) failed"),
        "{}",
        out.describe()
    );
}

#[test]
fn chart_lints_strict_with_default_values() {
    assert_lints_clean(&[], "with default values");
}

/// No public image is published, so the chart has no default one: without image.repository
/// the render fails before anything is applied, saying how to build and name one, instead of
/// an install that ends in ImagePullBackOff.
#[test]
fn an_unset_image_repository_fails_the_render_saying_how_to_get_an_image() {
    let said = |out: &crate::tools::Run| format!("{}{}", out.stdout, out.stderr);
    let out = helm_template_bare(&[]);
    assert!(
        !out.status.success(),
        "helm template without image.repository succeeded:\n{}",
        out.describe()
    );
    for needle in [
        "image.repository is not set",
        "docker build --build-arg SLUICE_COMMIT=$(git rev-parse --short=12 HEAD) -t REGISTRY/sluice:TAG .",
        "docker push REGISTRY/sluice:TAG",
        "--set image.repository=REGISTRY/sluice",
    ] {
        assert!(
            said(&out).contains(needle),
            "helm template did not say {needle:?}:\n{}",
            out.describe()
        );
    }
    // `helm lint` lets `required` through as a warning, by Helm's design (charts are linted
    // without their values): it still names what is missing.
    let out = helm_lint_bare(&[]);
    assert!(
        said(&out).contains("image.repository is not set"),
        "helm lint did not warn about image.repository:\n{}",
        out.describe()
    );
    // An empty repository is refused the same way, and a set one renders as given.
    let out = helm_template_bare(&["--set", "image.repository="]);
    assert!(!out.status.success(), "{}", out.describe());
    assert!(
        out.stderr.contains("image.repository is not set"),
        "{}",
        out.describe()
    );
    let out = helm_template_bare(&[
        "--set",
        "image.repository=ghcr.io/acme/sluice",
        "--set",
        "image.tag=v1.2.3",
    ]);
    assert!(out.status.success(), "{}", out.describe());
    let image = |m: &Manifests| str_at(sluice_container(m.deployment()), "image").to_string();
    assert_eq!(
        image(&Manifests::parse(&out.stdout)),
        "ghcr.io/acme/sluice:v1.2.3"
    );
    // The tests' own image file gives way to a values file after it.
    assert_eq!(
        image(&render(&all_on())),
        "registry.example/platform/sluice:0.1.0"
    );
}

#[test]
fn chart_lints_strict_with_every_option_on() {
    assert_lints_clean(&all_on(), "-f all-on-values.yaml");
}

#[test]
fn chart_lints_strict_with_the_quota_filter() {
    let args = [
        "--set",
        "istio.envoyFilter.enabled=true",
        "--set",
        "istio.envoyFilter.filter=rate_limit_quota",
    ];
    assert_lints_clean(&args, "with the quota filter");
    let mut all: Vec<&str> = all_on().to_vec();
    all.extend(args);
    assert_lints_clean(&all, "with every option on and the quota filter");
}

#[test]
fn values_schema_and_templates_reject_bad_values() {
    for bad in [
        "redis.type=MEMCACHE",
        "replicas=3",
        "config.logFormat=xml",
        "istio.envoyFilter.context=WAYPOINT",
        "istio.envoyFilter.filter=ext_authz",
        "istio.envoyFilter.quota.noAssignment=DENY",
        "istio.envoyFilter.quota.expiredFallback.requests_per_time_unit.requests_per_time_unit=5",
        "istio.envoyFilter.quota.expiredTimeout=5m",
        "tracing.protocol=zipkin",
        "tracing.endpoint=https://collector:4318",
        "tracing.samplingRate=2",
    ] {
        let out = helm_lint(&["--set", bad]);
        assert!(
            !out.status.success(),
            "helm lint accepted --set {bad}:\n{}",
            out.describe()
        );
        let out = helm_template_run(&["--set", bad]);
        assert!(
            !out.status.success(),
            "helm template accepted --set {bad}:\n{}",
            out.describe()
        );
    }
    // A grace period that does not outlast the drain would let the kubelet kill sluice
    // before its final Redis flush: the render fails and says why.
    let out = helm_template_run(&["--set", "terminationGracePeriodSeconds=20"]);
    assert!(
        !out.status.success(),
        "grace 20s = drain 20s was accepted:\n{}",
        out.describe()
    );
    assert!(
        out.stderr.contains("terminationGracePeriodSeconds"),
        "{}",
        out.describe()
    );
}

#[test]
fn default_render_passes_kubernetes_1_30_strict_validation() {
    let m = render(&[]);
    let custom = validate_builtin_kinds(&m);
    assert!(
        custom.is_empty(),
        "defaults must not need CRDs, got {}",
        custom.len()
    );
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "ServiceAccount",
        "PodDisruptionBudget",
    ] {
        assert!(m.has_kind(kind), "default render has no {kind}");
    }
    for kind in [
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "Secret",
        "EnvoyFilter",
        "ServiceMonitor",
    ] {
        assert!(
            !m.has_kind(kind),
            "{kind} is rendered by default but must be opt-in"
        );
    }
}

#[test]
fn every_option_on_render_passes_kubernetes_1_30_strict_validation() {
    let m = render(&all_on());
    let custom = validate_builtin_kinds(&m);
    let mut kinds: Vec<&str> = custom.iter().map(|o| str_at(o, "kind")).collect();
    kinds.sort();
    assert_eq!(kinds, ["EnvoyFilter", "ServiceMonitor"]);
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "ServiceAccount",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
    ] {
        assert!(m.has_kind(kind), "all-on render has no {kind}");
    }
}

#[test]
fn chart_example_rules_pass_sluice_check() {
    for (label, args) in [
        ("default values", vec![]),
        ("all-on values", all_on().to_vec()),
    ] {
        let m = render(&args);
        let rules = rendered_rules(&m);
        let out = sluice_check(&rules);
        assert!(
            out.status.success(),
            "`sluice check` rejected the chart's rules ({label}):\n{}\n{rules:#?}",
            out.describe()
        );
    }
    // The check is real: a broken file fails it.
    let bad = BTreeMap::from([(
        "bad.yaml".to_owned(),
        "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n".to_owned(),
    )]);
    let out = sluice_check(&bad);
    assert_eq!(
        out.status.code(),
        Some(1),
        "`sluice check` accepted an invalid unit:\n{}",
        out.describe()
    );
}
