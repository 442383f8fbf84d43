//! Loading rules from disk and hot reload: read a file or a directory of `*.yaml`/`*.yml`,
//! parse → validate → compile, then swap the new set in with one atomic store. A watcher on the
//! directory reloads after changes settle (debounced), which also covers Kubernetes ConfigMap
//! volumes, whose files are symlinks through a `..data` link that is swapped atomically.
//!
//! A load that fails leaves the rules in force untouched and reports every error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::core::clock::UnixMillis;
use crate::rls::RateLimiter;
use crate::rules::model::ConfigError;
use crate::rules::{self, RuleSet};
use crate::telemetry::ConfigLoad;

/// A rules file that could not be read at all.
fn read_error(path: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::new(&path.display().to_string(), format!("cannot read: {e}"))
}

/// The rules files at `path`: the file itself, or the directory's `*.yaml`/`*.yml` files
/// (dotfiles skipped, symlinks followed) in name order.
///
/// # Errors
/// When the path or a file cannot be read.
pub fn rule_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| read_error(path, &e))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| read_error(path, &e))? {
        let entry = entry.map_err(|e| read_error(path, &e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        // `metadata` follows symlinks, as ConfigMap files are links into `..data`.
        if yaml
            && !name.starts_with('.')
            && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file())
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Reads, parses, validates and compiles `files`.
///
/// # Errors
/// Every error in every file.
pub fn load_files(files: &[PathBuf], merge_domains: bool) -> Result<RuleSet, Vec<ConfigError>> {
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    for f in files {
        match std::fs::read_to_string(f) {
            Ok(text) => sources.push((f.display().to_string(), text)),
            Err(e) => errors.push(read_error(f, &e)),
        }
    }
    rules::with_prior_errors(errors, rules::compile_sources(&sources, merge_domains))
}

/// Loads the rules at `path` (a file or a directory).
///
/// # Errors
/// Every error found.
pub fn load_path(
    path: &Path,
    merge_domains: bool,
) -> Result<(RuleSet, Vec<String>), Vec<ConfigError>> {
    let files = rule_files(path).map_err(|e| vec![e])?;
    let set = load_files(&files, merge_domains)?;
    Ok((set, files.iter().map(|f| f.display().to_string()).collect()))
}

/// What the last loads did, for `/rlconfig` and readiness details.
#[derive(Debug, Default)]
pub struct ReloadStatus {
    inner: Mutex<StatusInner>,
}

#[derive(Debug, Default, Clone)]
struct StatusInner {
    loads: u64,
    errors: Vec<String>,
    errors_since: Option<UnixMillis>,
}

impl ReloadStatus {
    /// Successful loads so far, and the errors of the last failed load if it came after the
    /// last success (with when the failures started).
    pub fn snapshot(&self) -> (u64, Vec<String>, Option<UnixMillis>) {
        let s = self.inner.lock().clone();
        (s.loads, s.errors, s.errors_since)
    }

    fn succeeded(&self) {
        let mut s = self.inner.lock();
        s.loads += 1;
        s.errors.clear();
        s.errors_since = None;
    }

    fn failed(&self, errors: Vec<String>, now: UnixMillis) {
        let mut s = self.inner.lock();
        s.errors = errors;
        s.errors_since.get_or_insert(now);
    }
}

/// Loads `path` and swaps the result into `limiter`; on failure keeps the rules in force.
/// Returns whether the new rules were applied.
pub fn reload(
    path: &Path,
    merge_domains: bool,
    limiter: &RateLimiter,
    status: &ReloadStatus,
) -> bool {
    match load_path(path, merge_domains) {
        Ok((set, files)) => {
            tracing::info!(
                rules = set.rules().len(),
                files = files.len(),
                "rules loaded"
            );
            limiter.swap_rules(set, files);
            limiter.telemetry().config_load(ConfigLoad::Success);
            status.succeeded();
            true
        }
        Err(errors) => {
            for e in &errors {
                tracing::error!(error = %e, "rules rejected; the rules in force stay");
            }
            limiter.telemetry().config_load(ConfigLoad::Error);
            status.failed(
                errors.iter().map(ToString::to_string).collect(),
                limiter.now(),
            );
            false
        }
    }
}

/// Watches `path` (its directory, when it is a file) and reloads after changes settle for
/// `debounce`, until `shutdown` is cancelled.
///
/// # Errors
/// When the watcher cannot be set up.
pub fn spawn_watcher(
    path: PathBuf,
    merge_domains: bool,
    debounce: Duration,
    limiter: Arc<RateLimiter>,
    status: Arc<ReloadStatus>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, notify::Error> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    // The callback runs on notify's thread: it only signals; the reload runs in a tokio task.
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok() {
            let _ = tx.send(());
        }
    })?;
    let dir = if path.is_dir() {
        path.clone()
    } else {
        path.parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    };
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(tokio::spawn(async move {
        let _watcher = watcher; // dropping it stops the watch
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = rx.recv() => if got.is_none() { return },
            }
            // Debounce: a ConfigMap update or an editor's save is a burst of events.
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(debounce) => break,
                    got = rx.recv() => if got.is_none() { return },
                }
            }
            reload(&path, merge_domains, &limiter, &status);
        }
    }))
}
