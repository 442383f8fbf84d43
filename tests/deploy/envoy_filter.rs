//! The Istio `EnvoyFilter` (gateway and sidecar; the rate-limit filter, or the quota filter
//! with `istio.envoyFilter.filter=rate_limit_quota`): its structure, then its patch values
//! handed to the real Envoy in a minimal bootstrap (`envoy --mode validate`).

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::json;
use serde_yaml::Value;

use crate::manifests::{at, i64_at, opt_at, rendered_rules, seq_at, str_at, string_map, Manifests};
use crate::tools::{all_on, render, require_envoy, run};
use crate::{NAMESPACE, RELEASE};

/// The patch values of the EnvoyFilter, by applyTo (HTTP_FILTER, CLUSTER, VIRTUAL_HOST).
fn envoy_filter_patches(ef: &Value) -> BTreeMap<String, &Value> {
    let mut patches = BTreeMap::new();
    for p in seq_at(ef, "spec.configPatches") {
        let apply_to = str_at(p, "applyTo").to_owned();
        assert!(
            patches
                .insert(apply_to.clone(), at(p, "patch.value"))
                .is_none(),
            "two {apply_to} patches"
        );
    }
    patches
}

/// A static cluster on loopback; `h2` for gRPC.
fn static_cluster(name: &str, port: u16, h2: bool) -> serde_json::Value {
    let mut c = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": port}
            }}}]}]
        }
    });
    if h2 {
        c["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        });
    }
    c
}

/// A minimal bootstrap: one HTTP listener whose chain is [rate-limit filter, router], one
/// virtual host (with the patch's rate_limits merged in) routing to an upstream cluster,
/// and the given extra clusters.
fn bootstrap(
    http_filter: &Value,
    vhost_patch: Option<&Value>,
    clusters: Vec<serde_json::Value>,
) -> serde_json::Value {
    let mut vhost = json!({
        "name": "all",
        "domains": ["*"],
        // A route must point at an upstream cluster to be rate limited.
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app"}}]
    });
    if let Some(patch) = vhost_patch {
        let patch = serde_json::to_value(patch).expect("patch as JSON");
        for (k, v) in patch.as_object().expect("VIRTUAL_HOST patch is a map") {
            vhost[k] = v.clone();
        }
    }
    let mut all_clusters = vec![static_cluster("app", 18080, false)];
    all_clusters.extend(clusters);
    json!({
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "route_config": {"name": "local", "virtual_hosts": [vhost]},
                        "http_filters": [
                            serde_json::to_value(http_filter).expect("filter as JSON"),
                            {
                                "name": "envoy.filters.http.router",
                                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                            }
                        ]
                    }
                }]}]
            }],
            "clusters": all_clusters
        }
    })
}

/// `envoy --mode validate` on `config`; panics with Envoy's output unless it is OK.
fn envoy_validate(config: &serde_json::Value) {
    require_envoy();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("envoy.json");
    std::fs::write(&file, serde_json::to_string_pretty(config).unwrap()).expect("write bootstrap");
    let mut cmd = Command::new("envoy");
    cmd.args([
        "--mode",
        "validate",
        "--disable-hot-restart",
        "-l",
        "warning",
        "-c",
    ])
    .arg(&file);
    let out = run(cmd, "envoy --mode validate");
    assert!(
        out.status.success() && out.stdout.contains("OK"),
        "envoy rejected the EnvoyFilter's configuration:\n{}\n--- bootstrap ---\n{}",
        out.describe(),
        serde_json::to_string_pretty(config).unwrap()
    );
}

/// The rate-limit filter's checks shared by the gateway and sidecar cases; returns the
/// cluster name the filter calls.
fn check_ratelimit_filter(
    filter: &Value,
    domain: &str,
    rules: &BTreeMap<String, String>,
) -> String {
    assert_eq!(str_at(filter, "name"), "envoy.filters.http.ratelimit");
    assert_eq!(
        str_at(filter, "typed_config.@type"),
        "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    );
    assert_eq!(str_at(filter, "typed_config.domain"), domain);
    assert_eq!(
        str_at(
            filter,
            "typed_config.rate_limit_service.transport_api_version"
        ),
        "V3"
    );
    let domain_line = format!("domain: {domain}");
    assert!(
        rules
            .values()
            .any(|r| r.lines().any(|l| l.trim() == domain_line)),
        "no rules file has `{domain_line}`: the filter's requests would match nothing"
    );
    str_at(
        filter,
        "typed_config.rate_limit_service.grpc_service.envoy_grpc.cluster_name",
    )
    .to_owned()
}

/// Checks a gateway EnvoyFilter rendered with `args` and has Envoy validate its filter,
/// cluster and actions. `namespace`, `listener_port` and `deny` are what the values ask.
fn check_gateway_envoyfilter(
    args: &[&str],
    namespace: &str,
    listener_port: Option<i64>,
    deny: bool,
) {
    let m = render(args);
    let rules = rendered_rules(&m);
    let ef = m.one("EnvoyFilter");
    check_gateway_patches(ef, namespace, listener_port);

    let patches = envoy_filter_patches(ef);
    let filter = patches["HTTP_FILTER"];
    let cluster = patches["CLUSTER"];
    let vhost = patches["VIRTUAL_HOST"];
    let cluster_name = check_ratelimit_filter(filter, "edge", &rules);
    assert_eq!(
        at(filter, "typed_config.failure_mode_deny").as_bool(),
        Some(deny)
    );
    check_cluster_resolves_the_headless_service(&m, cluster, &cluster_name);
    assert!(!seq_at(vhost, "rate_limits").is_empty());

    let clusters = vec![serde_json::to_value(cluster).expect("cluster as JSON")];
    envoy_validate(&bootstrap(filter, Some(vhost), clusters));
}

/// The EnvoyFilter's namespace, its selector of the gateway's pods, and each patch's
/// context and operation; the filter goes before the router of the listener asked for.
fn check_gateway_patches(ef: &Value, namespace: &str, listener_port: Option<i64>) {
    assert_eq!(str_at(ef, "apiVersion"), "networking.istio.io/v1alpha3");
    assert_eq!(str_at(ef, "metadata.namespace"), namespace);
    assert_eq!(
        string_map(at(ef, "spec.workloadSelector.labels")),
        BTreeMap::from([("istio".to_owned(), "ingressgateway".to_owned())])
    );
    for p in seq_at(ef, "spec.configPatches") {
        assert_eq!(str_at(p, "match.context"), "GATEWAY");
        let op = match str_at(p, "applyTo") {
            "HTTP_FILTER" => "INSERT_BEFORE",
            "CLUSTER" => "ADD",
            "VIRTUAL_HOST" => "MERGE",
            other => panic!("unexpected patch applyTo {other}"),
        };
        assert_eq!(str_at(p, "patch.operation"), op);
    }
    let filter_patch = seq_at(ef, "spec.configPatches")
        .iter()
        .find(|p| str_at(p, "applyTo") == "HTTP_FILTER")
        .unwrap();
    assert_eq!(
        str_at(filter_patch, "match.listener.filterChain.filter.name"),
        "envoy.filters.network.http_connection_manager"
    );
    assert_eq!(
        str_at(
            filter_patch,
            "match.listener.filterChain.filter.subFilter.name"
        ),
        "envoy.filters.http.router"
    );
    assert_eq!(
        opt_at(filter_patch, "match.listener.portNumber").and_then(Value::as_i64),
        listener_port
    );
}

/// The filter calls the added cluster (Envoy's validate mode does not check that the
/// gRPC cluster exists), which resolves the headless Service on the gRPC port.
fn check_cluster_resolves_the_headless_service(m: &Manifests, cluster: &Value, cluster_name: &str) {
    assert_eq!(str_at(cluster, "name"), cluster_name);
    assert_eq!(str_at(cluster, "type"), "STRICT_DNS");
    let addr = at(
        cluster,
        "load_assignment.endpoints.0.lb_endpoints.0.endpoint.address.socket_address",
    );
    let headless = m.get("Service", &format!("{RELEASE}-headless"));
    assert_eq!(str_at(headless, "spec.clusterIP"), "None");
    assert_eq!(
        str_at(addr, "address"),
        format!("{RELEASE}-headless.{NAMESPACE}.svc.cluster.local")
    );
    assert_eq!(
        i64_at(addr, "port_value"),
        i64_at(headless, "spec.ports.0.port")
    );
    assert_eq!(str_at(headless, "spec.ports.0.name"), "grpc");
    assert!(
        opt_at(cluster, "typed_extension_protocol_options").is_some(),
        "gRPC needs an HTTP/2 upstream"
    );
}

#[test]
fn gateway_envoyfilter_with_default_values_passes_envoy_validate() {
    check_gateway_envoyfilter(
        &["--set", "istio.envoyFilter.enabled=true"],
        NAMESPACE,
        None,
        false,
    );
}

#[test]
fn gateway_envoyfilter_with_every_option_on_passes_envoy_validate() {
    check_gateway_envoyfilter(&all_on(), "istio-system", Some(8080), true);
}

#[test]
fn sidecar_envoyfilter_with_mesh_cluster_passes_envoy_validate() {
    let m = render(&[
        "--set",
        "istio.envoyFilter.enabled=true",
        "--set",
        "istio.envoyFilter.context=SIDECAR_INBOUND",
        "--set",
        "istio.envoyFilter.cluster=mesh",
        "--set",
        "istio.envoyFilter.workloadSelector.app=shop",
    ]);
    let rules = rendered_rules(&m);
    let ef = m.one("EnvoyFilter");
    assert_eq!(str_at(ef, "metadata.namespace"), NAMESPACE);
    assert_eq!(
        string_map(at(ef, "spec.workloadSelector.labels")),
        BTreeMap::from([("app".into(), "shop".into())])
    );
    let patches = envoy_filter_patches(ef);
    assert!(
        !patches.contains_key("CLUSTER"),
        "mesh mode must use Istio's own cluster"
    );
    for p in seq_at(ef, "spec.configPatches") {
        assert_eq!(str_at(p, "match.context"), "SIDECAR_INBOUND");
    }
    let cluster_name = check_ratelimit_filter(patches["HTTP_FILTER"], "edge", &rules);
    // Istio names the Service's outbound cluster outbound|<port>||<fqdn>.
    assert_eq!(
        cluster_name,
        format!("outbound|8081||{RELEASE}.{NAMESPACE}.svc.cluster.local")
    );
    // Stand in for Istio's cluster so the bootstrap is complete.
    let clusters = vec![static_cluster(&cluster_name, 18081, true)];
    envoy_validate(&bootstrap(
        patches["HTTP_FILTER"],
        patches.get("VIRTUAL_HOST").copied(),
        clusters,
    ));
}

/// The quota filter's checks: its type, its domain (which a rules file serves), and the
/// cluster its stream goes to; returns that cluster's name and the bucket settings of its
/// first matcher (or of `on_no_match` without one).
fn check_quota_filter<'a>(
    filter: &'a Value,
    domain: &str,
    rules: &BTreeMap<String, String>,
) -> (String, &'a Value) {
    assert_eq!(
        str_at(filter, "name"),
        "envoy.filters.http.rate_limit_quota"
    );
    assert_eq!(
        str_at(filter, "typed_config.@type"),
        "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
    );
    assert_eq!(str_at(filter, "typed_config.domain"), domain);
    let domain_line = format!("domain: {domain}");
    assert!(
        rules
            .values()
            .any(|r| r.lines().any(|l| l.trim() == domain_line)),
        "no rules file has `{domain_line}`: every bucket would be unknown"
    );
    let matchers = at(filter, "typed_config.bucket_matchers");
    let action = match opt_at(matchers, "matcher_list.matchers.0") {
        Some(m) => at(m, "on_match.action"),
        None => at(matchers, "on_no_match.action"),
    };
    let settings = at(action, "typed_config");
    assert_eq!(
        str_at(settings, "@type"),
        "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
    );
    let cluster = str_at(filter, "typed_config.rlqs_server.envoy_grpc.cluster_name").to_owned();
    (cluster, settings)
}

/// The bucket id `settings` build: each key with its header (a request header input) or its
/// fixed value.
fn bucket_id(settings: &Value) -> BTreeMap<String, String> {
    let builder = at(settings, "bucket_id_builder.bucket_id_builder");
    let map = builder.as_mapping().expect("bucket_id_builder is a map");
    map.iter()
        .map(|(k, v)| {
            let key = k.as_str().unwrap().to_owned();
            let value = match opt_at(v, "string_value") {
                Some(s) => s.as_str().unwrap().to_owned(),
                None => {
                    assert_eq!(
                        str_at(v, "custom_value.typed_config.@type"),
                        "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
                    );
                    format!(
                        "header {}",
                        str_at(v, "custom_value.typed_config.header_name")
                    )
                }
            };
            (key, value)
        })
        .collect()
}

/// Renders the chart with the quota filter (`args` added), checks the gateway EnvoyFilter
/// around it (no route actions: the filter builds its buckets), and has Envoy validate it.
/// Returns the filter's bucket settings for the caller's checks.
fn check_quota_envoyfilter(args: &[&str], namespace: &str, domain: &str) -> serde_yaml::Value {
    let mut all = vec![
        "--set",
        "istio.envoyFilter.enabled=true",
        "--set",
        "istio.envoyFilter.filter=rate_limit_quota",
    ];
    all.extend_from_slice(args);
    let m = render(&all);
    let rules = rendered_rules(&m);
    let ef = m.one("EnvoyFilter");
    assert_eq!(str_at(ef, "metadata.namespace"), namespace);
    let patches = envoy_filter_patches(ef);
    assert!(
        !patches.contains_key("VIRTUAL_HOST"),
        "the quota filter takes no route actions"
    );
    let filter = patches["HTTP_FILTER"];
    let (cluster_name, settings) = check_quota_filter(filter, domain, &rules);
    check_cluster_resolves_the_headless_service(&m, patches["CLUSTER"], &cluster_name);
    let clusters = vec![serde_json::to_value(patches["CLUSTER"]).expect("cluster as JSON")];
    envoy_validate(&bootstrap(filter, None, clusters));
    settings.clone()
}

#[test]
fn gateway_quota_envoyfilter_with_default_values_passes_envoy_validate() {
    let settings = check_quota_envoyfilter(&[], NAMESPACE, "edge");
    assert_eq!(
        bucket_id(&settings),
        BTreeMap::from([("tenant".to_owned(), "header x-tenant".to_owned())])
    );
    assert_eq!(
        str_at(
            &settings,
            "no_assignment_behavior.fallback_rate_limit.blanket_rule"
        ),
        "ALLOW_ALL"
    );
    assert_eq!(
        str_at(
            &settings,
            "expired_assignment_behavior.fallback_rate_limit.blanket_rule"
        ),
        "ALLOW_ALL"
    );
    assert_eq!(
        i64_at(&settings, "deny_response_settings.http_status.code"),
        429
    );
}

#[test]
fn gateway_quota_envoyfilter_with_every_option_on_passes_envoy_validate() {
    // Two headers (both needed: an and_matcher), a fixed entry, a local token bucket while
    // sluice is away; the domain whose rules have `tenant` → `plan`.
    let q = "istio.envoyFilter.quota";
    let sets = [
        format!("{q}.bucketHeaders.plan=x-plan"),
        format!("{q}.bucketValues.gateway=public"),
        format!("{q}.noAssignment=DENY_ALL"),
        format!("{q}.expiredFallback.token_bucket.max_tokens=100"),
        format!("{q}.expiredFallback.token_bucket.tokens_per_fill=100"),
        format!("{q}.expiredFallback.token_bucket.fill_interval=60s"),
        format!("{q}.expiredTimeout=120s"),
        "istio.envoyFilter.domain=internal".to_owned(),
    ];
    let mut args: Vec<&str> = all_on().to_vec();
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let settings = check_quota_envoyfilter(&args, "istio-system", "internal");
    assert_eq!(
        bucket_id(&settings),
        BTreeMap::from([
            ("gateway".to_owned(), "public".to_owned()),
            ("plan".to_owned(), "header x-plan".to_owned()),
            ("tenant".to_owned(), "header x-tenant".to_owned()),
        ])
    );
    assert_eq!(
        i64_at(
            &settings,
            "expired_assignment_behavior.fallback_rate_limit.token_bucket.max_tokens"
        ),
        100
    );
}

#[test]
fn quota_envoyfilter_with_fixed_entries_only_puts_every_request_in_one_bucket() {
    let q = "istio.envoyFilter.quota";
    let (no_header, value) = (
        format!("{q}.bucketHeaders.tenant=null"),
        format!("{q}.bucketValues.name=edge"),
    );
    let settings =
        check_quota_envoyfilter(&["--set", &no_header, "--set", &value], NAMESPACE, "edge");
    assert_eq!(
        bucket_id(&settings),
        BTreeMap::from([("name".to_owned(), "edge".to_owned())])
    );
    // No entry at all is no bucket id: the render fails and says why.
    let out = crate::tools::helm_template_run(&[
        "--set",
        "istio.envoyFilter.enabled=true",
        "--set",
        "istio.envoyFilter.filter=rate_limit_quota",
        "--set",
        &no_header,
    ]);
    assert!(
        !out.status.success() && out.stderr.contains("bucketHeaders or bucketValues"),
        "{}",
        out.describe()
    );
}

#[test]
fn sidecar_quota_envoyfilter_with_mesh_cluster_passes_envoy_validate() {
    let m = render(&[
        "--set",
        "istio.envoyFilter.enabled=true",
        "--set",
        "istio.envoyFilter.filter=rate_limit_quota",
        "--set",
        "istio.envoyFilter.context=SIDECAR_INBOUND",
        "--set",
        "istio.envoyFilter.cluster=mesh",
    ]);
    let rules = rendered_rules(&m);
    let patches = envoy_filter_patches(m.one("EnvoyFilter"));
    assert_eq!(
        patches.keys().collect::<Vec<_>>(),
        ["HTTP_FILTER"],
        "Istio's own cluster, no route actions"
    );
    let (cluster_name, _) = check_quota_filter(patches["HTTP_FILTER"], "edge", &rules);
    assert_eq!(
        cluster_name,
        format!("outbound|8081||{RELEASE}.{NAMESPACE}.svc.cluster.local")
    );
    let clusters = vec![static_cluster(&cluster_name, 18081, true)];
    envoy_validate(&bootstrap(patches["HTTP_FILTER"], None, clusters));
}
