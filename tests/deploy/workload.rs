//! The Deployment and the objects around it: probes, ports, security, the rules mount, the
//! env the values set (Redis auth from a Secret), the HPA, PDB, NetworkPolicy and
//! ServiceMonitor selecting the right pods and Service.

use std::collections::BTreeMap;

use serde_yaml::Value;

use crate::manifests::{
    at, env_value, env_var, i64_at, opt_at, rendered_rules, seconds, selects, seq_at,
    sluice_container, str_at, string_map, Manifests,
};
use crate::tools::{all_on, render};
use crate::{NAMESPACE, RELEASE};

#[test]
fn deployment_has_probes_ports_hardened_security_and_rules_mounted_as_directory() {
    let m = render(&[]);
    let deploy = m.deployment();
    let pod = at(deploy, "spec.template.spec");
    let c = sluice_container(deploy);
    let pod_labels = string_map(at(deploy, "spec.template.metadata.labels"));

    check_command(c);
    check_ports_and_probes(c);
    check_service_selects_the_pods(&m, deploy, &pod_labels);
    check_grace_outlasts_the_drain(pod, c);
    check_hardened_security(pod, c);
    check_resources_and_spread(pod, c, &pod_labels);
    check_rules_mounted_as_directory(&m, pod, c);
    check_local_mode_without_redis_or_otlp(c);
}

/// Default command: `sluice serve --config <the mounted directory>`.
fn check_command(c: &Value) {
    let args: Vec<&str> = seq_at(c, "args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["serve", "--config", "/etc/sluice/rules"]);
}

/// Ports, named so probes and the Service refer to them by name; probes: readiness on
/// /readyz, liveness (and startup) on /livez, on the HTTP port.
fn check_ports_and_probes(c: &Value) {
    let ports: BTreeMap<&str, i64> = seq_at(c, "ports")
        .iter()
        .map(|p| (str_at(p, "name"), i64_at(p, "containerPort")))
        .collect();
    assert_eq!(ports, BTreeMap::from([("grpc", 8081), ("http", 8080)]));
    assert_eq!(env_value(c, "GRPC_PORT"), "8081");
    assert_eq!(env_value(c, "PORT"), "8080");

    assert_eq!(str_at(c, "readinessProbe.httpGet.path"), "/readyz");
    assert_eq!(str_at(c, "livenessProbe.httpGet.path"), "/livez");
    assert_eq!(str_at(c, "startupProbe.httpGet.path"), "/livez");
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        assert_eq!(str_at(c, &format!("{probe}.httpGet.port")), "http");
    }
}

/// The Service exposes grpc 8081 and http 8080 and selects the pods.
fn check_service_selects_the_pods(
    m: &Manifests,
    deploy: &Value,
    pod_labels: &BTreeMap<String, String>,
) {
    let svc = m.get("Service", RELEASE);
    let svc_ports: BTreeMap<&str, (i64, &str)> = seq_at(svc, "spec.ports")
        .iter()
        .map(|p| {
            (
                str_at(p, "name"),
                (i64_at(p, "port"), str_at(p, "targetPort")),
            )
        })
        .collect();
    assert_eq!(
        svc_ports,
        BTreeMap::from([("grpc", (8081, "grpc")), ("http", (8080, "http"))])
    );
    assert!(
        selects(&string_map(at(svc, "spec.selector")), pod_labels),
        "Service selects no pod"
    );
    assert!(selects(
        &string_map(at(deploy, "spec.selector.matchLabels")),
        pod_labels
    ));
}

/// Termination grace outlasts sluice's own drain (SHUTDOWN_GRACE).
fn check_grace_outlasts_the_drain(pod: &Value, c: &Value) {
    let drain = seconds(env_value(c, "SHUTDOWN_GRACE"));
    let grace = i64_at(pod, "terminationGracePeriodSeconds");
    assert!(
        grace > drain,
        "terminationGracePeriodSeconds {grace} <= SHUTDOWN_GRACE {drain}s"
    );
}

/// Non-root, read-only root filesystem, nothing extra.
fn check_hardened_security(pod: &Value, c: &Value) {
    assert_eq!(
        at(pod, "securityContext.runAsNonRoot").as_bool(),
        Some(true)
    );
    assert_eq!(at(c, "securityContext.runAsNonRoot").as_bool(), Some(true));
    assert_eq!(
        at(c, "securityContext.readOnlyRootFilesystem").as_bool(),
        Some(true)
    );
    assert_eq!(
        at(c, "securityContext.allowPrivilegeEscalation").as_bool(),
        Some(false)
    );
    assert_ne!(i64_at(c, "securityContext.runAsUser"), 0);
    let dropped: Vec<&str> = seq_at(c, "securityContext.capabilities.drop")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(dropped, ["ALL"]);
    assert_eq!(
        str_at(pod, "securityContext.seccompProfile.type"),
        "RuntimeDefault"
    );
    assert_eq!(
        at(pod, "automountServiceAccountToken").as_bool(),
        Some(false)
    );
}

/// Resources are set; pods spread over zones and nodes.
fn check_resources_and_spread(pod: &Value, c: &Value, pod_labels: &BTreeMap<String, String>) {
    assert!(
        opt_at(c, "resources.requests.cpu").is_some()
            && opt_at(c, "resources.limits.memory").is_some()
    );
    let keys: Vec<&str> = seq_at(pod, "topologySpreadConstraints")
        .iter()
        .map(|t| str_at(t, "topologyKey"))
        .collect();
    assert_eq!(
        keys,
        ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    );
    for t in seq_at(pod, "topologySpreadConstraints") {
        assert!(selects(
            &string_map(at(t, "labelSelector.matchLabels")),
            pod_labels
        ));
    }
}

/// Rules: the ConfigMap mounted as a directory (never subPath), so the kubelet's
/// ..data symlink swap reaches sluice's reload.
fn check_rules_mounted_as_directory(m: &Manifests, pod: &Value, c: &Value) {
    let mount = seq_at(c, "volumeMounts")
        .iter()
        .find(|v| str_at(v, "name") == "rules")
        .expect("rules mount");
    assert_eq!(str_at(mount, "mountPath"), "/etc/sluice/rules");
    assert!(
        opt_at(mount, "subPath").is_none() && opt_at(mount, "subPathExpr").is_none(),
        "rules mounted with subPath"
    );
    let volume = seq_at(pod, "volumes")
        .iter()
        .find(|v| str_at(v, "name") == "rules")
        .expect("rules volume");
    assert_eq!(str_at(volume, "configMap.name"), format!("{RELEASE}-rules"));
    rendered_rules(m);
}

/// Local mode by default: no Redis settings at all; no OTLP either.
fn check_local_mode_without_redis_or_otlp(c: &Value) {
    for name in ["REDIS_URL", "REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS"] {
        assert!(env_var(c, name).is_none(), "{name} set without redis.urls");
    }
    for name in [
        "TRACING_ENABLED",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_METRICS_EXPORTER",
    ] {
        assert!(env_var(c, name).is_none(), "{name} set without tracing");
    }
}

#[test]
fn every_option_on_sets_redis_auth_from_secret_and_env_settings() {
    let m = render(&all_on());
    let deploy = m.deployment();
    let c = sluice_container(deploy);
    check_redis_auth_from_the_existing_secret(&m, c);
    check_env_settings(c);
    check_grace_and_anti_affinity(deploy, c);
    check_password_goes_into_a_chart_secret();
}

/// Redis in cluster mode over TLS, its password by secretKeyRef from the Secret named in
/// values, which the chart then does not create.
fn check_redis_auth_from_the_existing_secret(m: &Manifests, c: &Value) {
    assert_eq!(
        env_value(c, "REDIS_URL"),
        "redis-0.redis.data.svc.cluster.local:6379,redis-1.redis.data.svc.cluster.local:6379,redis-2.redis.data.svc.cluster.local:6379"
    );
    assert_eq!(env_value(c, "REDIS_TYPE"), "CLUSTER");
    assert_eq!(env_value(c, "REDIS_TLS"), "true");
    let auth = env_var(c, "REDIS_AUTH").expect("REDIS_AUTH");
    assert!(
        opt_at(auth, "value").is_none(),
        "REDIS_AUTH must not be a plain value"
    );
    assert_eq!(
        str_at(auth, "valueFrom.secretKeyRef.name"),
        "redis-credentials"
    );
    assert_eq!(str_at(auth, "valueFrom.secretKeyRef.key"), "password");
    assert!(
        !m.has_kind("Secret"),
        "an existing Secret was named: the chart must not create one"
    );
}

/// Every setting the values turn on reaches the env.
fn check_env_settings(c: &Value) {
    for (name, value) in [
        ("LOG_LEVEL", "debug"),
        ("LOG_FORMAT", "text"),
        ("SHADOW_MODE", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("REDIS_PERSECOND", "true"),
        (
            "REDIS_PERSECOND_URL",
            "redis-fast.redis.data.svc.cluster.local:6379",
        ),
        ("REDIS_PERSECOND_TLS", "true"),
        ("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf"),
        ("LIMIT_RESPONSE_BODY", "problem"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ("MERGE_DOMAIN_CONFIG", "true"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("CACHE_KEY_PREFIX", "prod-edge"),
        ("SHUTDOWN_GRACE", "25s"),
        ("RUST_BACKTRACE", "1"),
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SAMPLING_RATE", "0.25"),
        ("TRACING_SERVICE_NAME", "RateLimit"),
        ("TRACING_SERVICE_NAMESPACE", "edge"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector.observability:4317",
        ),
        ("OTEL_METRICS_EXPORTER", "otlp"),
        ("RLQS_ENABLED", "true"),
        ("RLQS_UNKNOWN_BUCKETS", "edge=DENY_ALL,*=ALLOW_ALL"),
        ("RLQS_ASSIGNMENT_TTL", "30s"),
        ("RLQS_ABANDON_AFTER", "5m"),
        ("RLQS_MAX_STREAMS", "1024"),
        ("RLQS_MAX_BUCKETS_PER_STREAM", "5000"),
        ("RLQS_MAX_BUCKETS", "50000"),
    ] {
        assert_eq!(env_value(c, name), value, "env {name}");
    }
    // Each pod is its own service.instance.id.
    assert_eq!(
        str_at(
            env_var(c, "TRACING_SERVICE_INSTANCE_ID").expect("instance id"),
            "valueFrom.fieldRef.fieldPath"
        ),
        "metadata.name"
    );
}

/// Grace outlasts the preStop sleep plus the drain; one pod per node.
fn check_grace_and_anti_affinity(deploy: &Value, c: &Value) {
    let pod = at(deploy, "spec.template.spec");
    let pre_stop = i64_at(c, "lifecycle.preStop.sleep.seconds");
    let grace = i64_at(pod, "terminationGracePeriodSeconds");
    assert!(
        grace > pre_stop + seconds(env_value(c, "SHUTDOWN_GRACE")),
        "grace {grace} too short"
    );
    assert_eq!(
        str_at(
            pod,
            "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution.0.topologyKey"
        ),
        "kubernetes.io/hostname"
    );
}

/// A password given in values goes into a chart-made Secret, still by secretKeyRef.
fn check_password_goes_into_a_chart_secret() {
    let m = render(&[
        "--set",
        "redis.urls={redis:6379}",
        "--set",
        "redis.auth.password=s3cret",
    ]);
    let c = sluice_container(m.deployment());
    let secret = m.get("Secret", &format!("{RELEASE}-redis"));
    let auth = env_var(c, "REDIS_AUTH").expect("REDIS_AUTH");
    assert_eq!(
        str_at(auth, "valueFrom.secretKeyRef.name"),
        str_at(secret, "metadata.name")
    );
    let key = str_at(auth, "valueFrom.secretKeyRef.key");
    assert!(
        opt_at(secret, &format!("data.{key}")).is_some(),
        "Secret has no key {key}"
    );
    assert!(
        !m.text.contains("s3cret"),
        "the password appears in clear in the manifests"
    );
}

#[test]
fn existing_rules_configmap_is_mounted_and_none_is_created() {
    let m = render(&["--set", "rules.existingConfigMap=team-rules"]);
    assert!(
        !m.has_kind("ConfigMap"),
        "a rules ConfigMap was rendered beside the existing one"
    );
    let pod = at(m.deployment(), "spec.template.spec");
    let volume = seq_at(pod, "volumes")
        .iter()
        .find(|v| str_at(v, "name") == "rules")
        .expect("rules volume");
    assert_eq!(str_at(volume, "configMap.name"), "team-rules");
    let mount = seq_at(sluice_container(m.deployment()), "volumeMounts")
        .iter()
        .find(|v| str_at(v, "name") == "rules")
        .expect("rules mount");
    assert!(opt_at(mount, "subPath").is_none());
}

#[test]
fn hpa_pdb_networkpolicy_and_servicemonitor_target_the_right_objects() {
    let m = render(&all_on());
    let deploy = m.deployment();
    let pod_labels = string_map(at(deploy, "spec.template.metadata.labels"));

    check_hpa_scales_the_deployment(&m, deploy);
    check_pdb_selects_the_pods(&m, &pod_labels);
    check_network_policy_selects_the_pods(&m, &pod_labels);
    check_service_monitor_scrapes_the_main_service(&m);
}

fn check_hpa_scales_the_deployment(m: &Manifests, deploy: &Value) {
    let hpa = m.one("HorizontalPodAutoscaler");
    assert_eq!(str_at(hpa, "apiVersion"), "autoscaling/v2");
    assert_eq!(str_at(hpa, "spec.scaleTargetRef.kind"), "Deployment");
    assert_eq!(
        str_at(hpa, "spec.scaleTargetRef.name"),
        str_at(deploy, "metadata.name")
    );
    assert!(
        opt_at(deploy, "spec.replicas").is_none(),
        "replicas set while the HPA owns them"
    );
}

fn check_pdb_selects_the_pods(m: &Manifests, pod_labels: &BTreeMap<String, String>) {
    let pdb = m.one("PodDisruptionBudget");
    assert_eq!(str_at(pdb, "apiVersion"), "policy/v1");
    assert!(selects(
        &string_map(at(pdb, "spec.selector.matchLabels")),
        pod_labels
    ));
    assert_eq!(i64_at(pdb, "spec.minAvailable"), 2);
}

fn check_network_policy_selects_the_pods(m: &Manifests, pod_labels: &BTreeMap<String, String>) {
    let np = m.one("NetworkPolicy");
    assert!(selects(
        &string_map(at(np, "spec.podSelector.matchLabels")),
        pod_labels
    ));
    let ingress_ports: Vec<&str> = seq_at(np, "spec.ingress")
        .iter()
        .map(|r| str_at(r, "ports.0.port"))
        .collect();
    assert_eq!(ingress_ports, ["grpc", "http"]);
    let types: Vec<&str> = seq_at(np, "spec.policyTypes")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, ["Ingress", "Egress"]);
}

/// ServiceMonitor (a CRD, so kubernetes-validate cannot check it): the fields the
/// Prometheus Operator needs, pointing at the main Service's http port and not at the
/// headless Service (which would scrape every pod twice).
fn check_service_monitor_scrapes_the_main_service(m: &Manifests) {
    let sm = m.one("ServiceMonitor");
    assert_eq!(str_at(sm, "apiVersion"), "monitoring.coreos.com/v1");
    assert_eq!(str_at(sm, "metadata.namespace"), "monitoring");
    assert_eq!(
        str_at(sm, "metadata.labels.release"),
        "kube-prometheus-stack"
    );
    let names: Vec<&str> = seq_at(sm, "spec.namespaceSelector.matchNames")
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(names, [NAMESPACE]);
    let selector = string_map(at(sm, "spec.selector.matchLabels"));
    let svc = m.get("Service", RELEASE);
    assert!(
        selects(&selector, &string_map(at(svc, "metadata.labels"))),
        "ServiceMonitor misses the Service"
    );
    let headless = m.get("Service", &format!("{RELEASE}-headless"));
    assert!(
        !selects(&selector, &string_map(at(headless, "metadata.labels"))),
        "ServiceMonitor also selects the headless Service"
    );
    // /metrics on http, and the reference's names on http-ref (metrics.referenceNames).
    let endpoints = seq_at(sm, "spec.endpoints");
    assert_eq!(endpoints.len(), 2);
    let ep = &endpoints[0];
    assert_eq!(str_at(ep, "port"), "http");
    assert!(seq_at(svc, "spec.ports")
        .iter()
        .any(|p| str_at(p, "name") == "http"));
    assert_eq!(str_at(ep, "path"), "/metrics");
    assert_eq!(str_at(ep, "interval"), "15s");
    assert_eq!(str_at(ep, "scrapeTimeout"), "5s");
    for list in ["relabelings", "metricRelabelings"] {
        for r in seq_at(ep, list) {
            assert!(
                r.as_mapping().is_some_and(|m| !m.is_empty()),
                "empty {list} entry"
            );
        }
    }
}
