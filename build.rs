//! Build script: records the commit the binary is built from (`SLUICE_COMMIT` when set, as
//! an image build without `.git` passes it; else `git rev-parse`), for `sluice --version`,
//! `sluice_build_info` and `/rlconfig/status`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_COMMIT");
    let commit = std::env::var("SLUICE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SLUICE_COMMIT={commit}");
}

/// The checked-out commit (12 hex digits), and a rerun when it moves.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // HEAD, and the branch file it names, move with each commit; packed refs after a gc.
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| !c.is_empty())
}
