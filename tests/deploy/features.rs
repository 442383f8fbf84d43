//! Optional features the values switch on, each with its variables, mounts and ports (and
//! off by default): the Grafana dashboard, gRPC TLS, the reference's metrics, rules over
//! xDS, Redis Sentinel; and the quota service, on by default, with its settings.

use serde_yaml::Value;

use crate::manifests::{
    at, env_value, env_var, i64_at, opt_at, resolve_env, seq_at, sluice_container, str_at, yaml,
};
use crate::tools::{all_on, helm_template_run, render, validate_builtin_kinds};
use crate::RELEASE;

#[test]
fn the_grafana_dashboard_ships_as_a_configmap_for_the_sidecar() {
    let m = render(&all_on());
    let cm = m.get("ConfigMap", &format!("{RELEASE}-dashboard"));
    assert_eq!(str_at(cm, "metadata.labels.grafana_dashboard"), "1");
    assert_eq!(str_at(cm, "metadata.namespace"), "monitoring");
    let json = at(cm, "data")
        .get("sluice.json")
        .and_then(Value::as_str)
        .expect("data.sluice.json");
    let shipped: serde_json::Value =
        serde_json::from_str(json).expect("the dashboard in the ConfigMap is JSON");
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/helm/sluice/dashboards/sluice.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(shipped, file);
    // Off by default.
    let plain = render(&[]);
    assert!(plain
        .objects
        .iter()
        .all(|o| str_at(o, "metadata.name") != format!("{RELEASE}-dashboard")));
}

#[test]
fn grpc_tls_mounts_the_secrets_and_sets_the_variables() {
    let m = render(&[
        "--set",
        "grpcTls.enabled=true",
        "--set",
        "grpcTls.secretName=sluice-tls",
        "--set",
        "grpcTls.clientCa.secretName=sluice-tls",
        "--set",
        "grpcTls.clientSan=envoy.example",
    ]);
    assert!(validate_builtin_kinds(&m).is_empty());
    let deploy = m.deployment();
    let c = sluice_container(deploy);
    for (name, value) in [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/etc/sluice/grpc-tls/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/etc/sluice/grpc-tls/tls.key"),
        (
            "GRPC_CLIENT_TLS_CACERT",
            "/etc/sluice/grpc-client-ca/ca.crt",
        ),
        ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
    ] {
        assert_eq!(env_value(c, name), value, "env {name}");
    }
    // Directory mounts (no subPath): a rotated Secret reaches the files sluice re-reads.
    for mount in seq_at(c, "volumeMounts") {
        assert!(opt_at(mount, "subPath").is_none(), "{}", yaml(mount));
    }
    let volumes = seq_at(deploy, "spec.template.spec.volumes");
    let secret_of = |name: &str| {
        let v = volumes
            .iter()
            .find(|v| str_at(v, "name") == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        str_at(v, "secret.secretName").to_string()
    };
    assert_eq!(secret_of("grpc-tls"), "sluice-tls");
    assert_eq!(secret_of("grpc-client-ca"), "sluice-tls");

    // Off by default: no variable, no volume.
    let m = render(&[]);
    let c = sluice_container(m.deployment());
    assert!(env_var(c, "GRPC_SERVER_USE_TLS").is_none());

    for bad in [
        &["--set", "grpcTls.enabled=true"][..],
        &["--set", "grpcTls.clientSan=envoy.example"][..],
        &[
            "--set",
            "grpcTls.enabled=true",
            "--set",
            "grpcTls.secretName=s",
            "--set",
            "istio.envoyFilter.enabled=true",
        ][..],
    ] {
        let out = helm_template_run(bad);
        assert!(
            !out.status.success(),
            "accepted {bad:?}:\n{}",
            out.describe()
        );
        assert!(out.stderr.contains("grpcTls"), "{}", out.describe());
    }
}

#[test]
fn reference_metrics_values_set_the_variables_ports_and_scrape() {
    let m = render(&all_on());
    let deploy = m.deployment();
    let c = sluice_container(deploy);
    for (name, value) in [
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "statsd-exporter.monitoring"),
        ("STATSD_PORT", "8125"),
        ("STATS_FLUSH_INTERVAL", "10s"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":9090"),
        ("PROMETHEUS_PATH", "/metrics"),
    ] {
        assert_eq!(env_value(c, name), value, "env {name}");
    }
    // The plain values sluice reads resolve into settings with both on.
    let settings = resolve_env(c, |_| false, &[]);
    assert_eq!(
        settings.statsd.expect("statsd on").addr,
        "statsd-exporter.monitoring:8125"
    );
    assert_eq!(
        settings.prometheus.expect("prometheus on").addr.port(),
        9090
    );

    let port = seq_at(c, "ports")
        .iter()
        .find(|p| str_at(p, "name") == "http-ref")
        .expect("container port http-ref");
    assert_eq!(i64_at(port, "containerPort"), 9090);
    let svc = m.get("Service", RELEASE);
    assert!(
        seq_at(svc, "spec.ports")
            .iter()
            .any(|p| str_at(p, "name") == "http-ref" && str_at(p, "targetPort") == "http-ref"),
        "Service port http-ref"
    );
    let sm = &m.of_kind("ServiceMonitor")[0];
    assert!(
        seq_at(sm, "spec.endpoints")
            .iter()
            .any(|e| str_at(e, "port") == "http-ref" && str_at(e, "path") == "/metrics"),
        "ServiceMonitor scrapes http-ref"
    );
    let np = &m.of_kind("NetworkPolicy")[0];
    let text = yaml(np);
    assert!(text.contains("port: http-ref"), "{text}");

    // Off by default: no variables, no port.
    let plain = render(&[]);
    let c = sluice_container(plain.deployment());
    assert!(env_var(c, "USE_STATSD").is_none() && env_var(c, "USE_PROMETHEUS").is_none());
    assert!(!seq_at(c, "ports")
        .iter()
        .any(|p| str_at(p, "name") == "http-ref"));
}

#[test]
fn rules_over_xds_set_the_references_variables_and_mount_the_tls_secrets() {
    let m = render(&[
        "--set",
        "rules.xds.enabled=true",
        "--set",
        "rules.xds.serverUrl=envoy-gateway.envoy-gateway-system:18001",
        "--set",
        "rules.xds.nodeMetadata=cluster=prod",
        "--set",
        "rules.xds.tls.enabled=true",
        "--set",
        "rules.xds.tls.caSecret=xds-ca",
        "--set",
        "rules.xds.tls.clientSecret=xds-client",
    ]);
    let deploy = m.deployment();
    let c = sluice_container(deploy);
    for (name, value) in [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            "envoy-gateway.envoy-gateway-system:18001",
        ),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "cluster=prod"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        (
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            "/etc/sluice/xds-ca/ca.crt",
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "/etc/sluice/xds-client/tls.crt",
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            "/etc/sluice/xds-client/tls.key",
        ),
    ] {
        assert_eq!(env_value(c, name), value, "env {name}");
    }
    let node = env_var(c, "CONFIG_GRPC_XDS_NODE_ID").expect("CONFIG_GRPC_XDS_NODE_ID");
    assert_eq!(
        str_at(node, "valueFrom.fieldRef.fieldPath"),
        "metadata.name"
    );
    let mounts: Vec<&str> = seq_at(c, "volumeMounts")
        .iter()
        .map(|v| str_at(v, "mountPath"))
        .collect();
    assert!(mounts.contains(&"/etc/sluice/xds-ca") && mounts.contains(&"/etc/sluice/xds-client"));
    let pod = at(deploy, "spec.template.spec");
    let secrets: Vec<&str> = seq_at(pod, "volumes")
        .iter()
        .filter_map(|v| opt_at(v, "secret.secretName").and_then(Value::as_str))
        .collect();
    assert_eq!(secrets, ["xds-ca", "xds-client"]);
    validate_builtin_kinds(&m);
    // The plain variables resolve into xDS settings (without the TLS files, which sluice
    // checks at start and which only the pod has).
    let settings = resolve_env(
        c,
        |k| k.ends_with("_CACERT") || k.ends_with("_CERT") || k.ends_with("_KEY"),
        &[("CONFIG_GRPC_XDS_NODE_ID", "sluice-0")],
    );
    assert!(settings.xds.is_some(), "xDS on");

    // A server URL is required.
    let run = helm_template_run(&["--set", "rules.xds.enabled=true"]);
    assert!(
        !run.status.success() && run.stderr.contains("rules.xds.serverUrl is required"),
        "{}",
        run.describe()
    );
}

#[test]
fn sentinel_values_name_the_master_first_and_take_the_sentinels_password_from_a_secret() {
    let m = render(&[
        "--set",
        "redis.urls={sentinel-0.redis:26379,sentinel-1.redis:26379}",
        "--set",
        "redis.type=SENTINEL",
        "--set",
        "redis.sentinel.masterName=mymaster",
        "--set",
        "redis.sentinel.authSecret=sentinel-creds",
    ]);
    let c = sluice_container(m.deployment());
    assert_eq!(
        env_value(c, "REDIS_URL"),
        "mymaster,sentinel-0.redis:26379,sentinel-1.redis:26379"
    );
    assert_eq!(env_value(c, "REDIS_TYPE"), "SENTINEL");
    let auth = env_var(c, "REDIS_SENTINEL_AUTH").expect("REDIS_SENTINEL_AUTH");
    assert_eq!(
        str_at(auth, "valueFrom.secretKeyRef.name"),
        "sentinel-creds"
    );
    assert_eq!(
        str_at(auth, "valueFrom.secretKeyRef.key"),
        "sentinel-password"
    );
    let settings = resolve_env(c, |_| false, &[]);
    assert!(settings.redis.is_some(), "global mode");
    // The master's name is required.
    let run = helm_template_run(&[
        "--set",
        "redis.urls={sentinel-0.redis:26379}",
        "--set",
        "redis.type=SENTINEL",
    ]);
    assert!(
        !run.status.success() && run.stderr.contains("redis.sentinel.masterName is required"),
        "{}",
        run.describe()
    );
}

#[test]
fn a_per_second_redis_reaches_sluices_settings_with_its_password_from_a_secret() {
    let main = ["--set", "redis.urls={redis:6379}"];
    // Off by default.
    let c = render(&main);
    let c = sluice_container(c.deployment());
    assert!(env_var(c, "REDIS_PERSECOND").is_none());
    let m = render(&[
        main[0],
        main[1],
        "--set",
        "redis.perSecond.urls={fast-0.redis:26379,fast-1.redis:26379}",
        "--set",
        "redis.perSecond.type=SENTINEL",
        "--set",
        "redis.perSecond.masterName=fast",
        "--set",
        "redis.perSecond.auth.existingSecret=fast-creds",
    ]);
    let c = sluice_container(m.deployment());
    assert_eq!(env_value(c, "REDIS_PERSECOND"), "true");
    assert_eq!(
        env_value(c, "REDIS_PERSECOND_URL"),
        "fast,fast-0.redis:26379,fast-1.redis:26379"
    );
    let auth = env_var(c, "REDIS_PERSECOND_AUTH").expect("REDIS_PERSECOND_AUTH");
    assert_eq!(str_at(auth, "valueFrom.secretKeyRef.name"), "fast-creds");
    let settings = resolve_env(c, |_| false, &[]);
    assert!(settings.redis_per_second.is_some(), "a per-second Redis");
    // Its master's name is required too.
    let run = helm_template_run(&[
        main[0],
        main[1],
        "--set",
        "redis.perSecond.urls={fast-0.redis:26379}",
        "--set",
        "redis.perSecond.type=SENTINEL",
    ]);
    assert!(
        !run.status.success()
            && run
                .stderr
                .contains("redis.perSecond.masterName is required"),
        "{}",
        run.describe()
    );
}

#[test]
fn the_quota_service_is_on_by_default_and_its_values_reach_sluices_settings() {
    // The chart's defaults are sluice's.
    let m = render(&[]);
    let c = sluice_container(m.deployment());
    assert_eq!(env_value(c, "RLQS_ENABLED"), "true");
    let settings = resolve_env(c, |_| false, &[]);
    assert_eq!(settings.rlqs, Some(sluice::rlqs::Config::default()));

    let m = render(&[
        "--set",
        "quotaService.unknownBuckets=DENY_ALL",
        "--set",
        "quotaService.assignmentTtl=30s",
        "--set",
        "quotaService.abandonAfter=2m",
        "--set",
        "quotaService.maxStreams=100",
        "--set",
        "quotaService.maxBucketsPerStream=50",
        "--set",
        "quotaService.maxBuckets=1000",
        "--set",
        "quotaService.maxBucketIdBytes=2048",
        "--set",
        "quotaService.maxTrackedIdBytes=134217728",
    ]);
    let c = sluice_container(m.deployment());
    let rlqs = resolve_env(c, |_| false, &[]).rlqs.expect("served");
    assert_eq!(
        rlqs.unknown.for_domain("any"),
        sluice::rlqs::share::Strategy::DenyAll
    );
    assert_eq!(rlqs.assignment_ttl, std::time::Duration::from_secs(30));
    assert_eq!(rlqs.abandon_after, std::time::Duration::from_secs(120));
    assert_eq!(
        (
            rlqs.max_streams,
            rlqs.max_buckets_per_stream,
            rlqs.max_buckets
        ),
        (100, 50, 1000)
    );
    assert_eq!(
        (rlqs.max_bucket_id_bytes, rlqs.max_tracked_id_bytes),
        (2048, 128 << 20)
    );

    // Off: the one variable that says so, none of the others.
    let m = render(&["--set", "quotaService.enabled=false"]);
    let c = sluice_container(m.deployment());
    assert_eq!(env_value(c, "RLQS_ENABLED"), "false");
    assert!(env_var(c, "RLQS_MAX_STREAMS").is_none());
    assert_eq!(resolve_env(c, |_| false, &[]).rlqs, None);

    // What sluice would refuse at start, the schema refuses at install.
    for bad in [
        "quotaService.unknownBuckets=RATE",
        "quotaService.assignmentTtl=1500ms",
        "quotaService.maxStreams=0",
    ] {
        let out = helm_template_run(&["--set", bad]);
        assert!(!out.status.success(), "accepted --set {bad}");
    }
}

#[test]
fn the_admin_token_is_a_secret_mounted_as_sluices_token_file() {
    // Off by default: /reset is refused.
    let c = render(&[]);
    assert!(env_var(sluice_container(c.deployment()), "ADMIN_TOKEN_FILE").is_none());
    let m = render(&["--set", "adminToken.existingSecret=sluice-admin"]);
    let deploy = m.deployment();
    let c = sluice_container(deploy);
    assert_eq!(
        env_value(c, "ADMIN_TOKEN_FILE"),
        "/etc/sluice/admin-token/token"
    );
    let mount = seq_at(c, "volumeMounts")
        .iter()
        .find(|v| str_at(v, "name") == "admin-token")
        .expect("the token's mount");
    assert_eq!(str_at(mount, "mountPath"), "/etc/sluice/admin-token");
    let volume = seq_at(deploy, "spec.template.spec.volumes")
        .iter()
        .find(|v| str_at(v, "name") == "admin-token")
        .expect("the token's volume");
    assert_eq!(str_at(volume, "secret.secretName"), "sluice-admin");
    assert_eq!(str_at(volume, "secret.items.0.path"), "token");
}
