//! Loading rules from disk and hot reload: read a file or a directory of `*.yaml`/`*.yml`,
//! parse → validate → compile, then swap the new set in with one atomic store. A watcher on the
//! directory reloads after changes settle (debounced), which also covers Kubernetes ConfigMap
//! volumes, whose files are symlinks through a `..data` link that is swapped atomically.
//!
//! Only events that can change content start a reload ([`is_content_change`]): a read of the
//! directory, including the reload's own, never does.
//!
//! A load that fails leaves the rules in force untouched and reports every error. Loads run
//! on blocking threads ([`load_and_swap`] in `sources/mod.rs`, for files and xDS alike): a
//! large file takes most of a second to parse and compile, time no request on a runtime
//! worker should wait.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio_util::sync::CancellationToken;

use crate::rls::RateLimiter;
use crate::rules::model::ConfigError;
use crate::rules::prescan::MAX_FILE_BYTES;
use crate::rules::{self, CompileOptions, RuleSet};

use super::{load_and_swap, ReloadStatus};

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

/// Reads a rules file, refusing one over [`MAX_FILE_BYTES`] before reading it whole (the
/// parser refuses it anyway; this keeps a runaway file out of memory).
fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| read_error(path, &e))?;
    let mut text = String::new();
    // One byte past the bound is enough to know the file is too large.
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| read_error(path, &e))?;
    if text.len() > MAX_FILE_BYTES {
        return Err(ConfigError::new(
            &path.display().to_string(),
            format!("the file is more than the {MAX_FILE_BYTES} bytes allowed"),
        ));
    }
    Ok(text)
}

/// Reads, parses, validates and compiles `files`, as `options` say.
///
/// # Errors
/// Every error in every file.
pub fn load_files(files: &[PathBuf], options: CompileOptions) -> Result<RuleSet, Vec<ConfigError>> {
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    for f in files {
        match read_bounded(f) {
            Ok(text) => sources.push((f.display().to_string(), text)),
            Err(e) => errors.push(e),
        }
    }
    rules::with_prior_errors(errors, rules::compile_sources_with(&sources, options))
}

/// Loads the rules at `path` (a file or a directory), at start and on every reload, and
/// logs their warnings: a load that goes ahead still says what it ignored.
///
/// # Errors
/// Every error found.
pub fn load_path(
    path: &Path,
    options: CompileOptions,
) -> Result<(RuleSet, Vec<String>), Vec<ConfigError>> {
    let files = rule_files(path).map_err(|e| vec![e])?;
    let set = load_files(&files, options)?;
    for w in set.warnings() {
        tracing::warn!(warning = %w, "rules file warning");
    }
    Ok((set, files.iter().map(|f| f.display().to_string()).collect()))
}

/// Loads `path` and swaps the result into `limiter` off the serving threads
/// ([`load_and_swap`]); on failure keeps the rules in force. Returns whether the new rules
/// were applied.
pub async fn reload(
    path: &Path,
    options: CompileOptions,
    limiter: &Arc<RateLimiter>,
    status: &ReloadStatus,
) -> bool {
    let path_owned = path.to_path_buf();
    match load_and_swap(limiter, move || load_path(&path_owned, options)).await {
        Ok(loaded) => {
            tracing::info!(rules = loaded.rules, files = loaded.files, "rules loaded");
            status.count_success(limiter);
            true
        }
        Err(errors) => {
            for e in &errors {
                tracing::error!(error = %e, "rules rejected; the rules in force stay");
            }
            status.count_failure(limiter, errors.iter().map(ToString::to_string).collect());
            false
        }
    }
}

/// Whether a watch event can change what the rules directory holds. Reads (`open`, `access`,
/// `close` without a write) and metadata changes (atime, chmod) cannot, and must not count:
/// the reload itself reads every file, so counting reads would start a reload loop that never
/// ends (as would any `cat`, a second sluice, or `sluice check` on the directory). Writes,
/// creations, removals and renames do; the ConfigMap `..data` symlink swap is a rename.
pub fn is_content_change(event: &notify::Event) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => true,
        // Unknown kinds (a backend that cannot tell): reload rather than miss a change.
        EventKind::Any | EventKind::Other => true,
    }
}

/// Watches the directory of `path` (itself, when it is a directory) and sends the paths of
/// every event that can change its content ([`is_content_change`]). The watch lasts as long
/// as the returned watcher; the notify callback only sends, so no I/O runs on its thread.
///
/// # Errors
/// When the watch cannot be set up.
pub fn watch_changes(
    path: &Path,
) -> Result<
    (
        notify::RecommendedWatcher,
        tokio::sync::mpsc::UnboundedReceiver<Vec<PathBuf>>,
    ),
    notify::Error,
> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher =
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(event) if is_content_change(&event) => {
                let _ = tx.send(event.paths);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "rules watch error"),
        })?;
    let dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok((watcher, rx))
}

/// Watches `path` (its directory, when it is a file) and reloads after changes settle for
/// `debounce`, until `shutdown` is cancelled.
///
/// # Errors
/// When the watcher cannot be set up.
pub fn spawn_watcher(
    path: PathBuf,
    options: CompileOptions,
    debounce: Duration,
    limiter: Arc<RateLimiter>,
    status: Arc<ReloadStatus>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, notify::Error> {
    let (watcher, mut rx) = watch_changes(&path)?;
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
            reload(&path, options, &limiter, &status).await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next batch of event paths, failing the test when none comes within a generous bound.
    async fn next_paths(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<PathBuf>>,
    ) -> Vec<PathBuf> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no change event within 10 s")
            .expect("watcher gone")
    }

    #[test]
    fn a_file_over_the_size_bound_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, "#".repeat(MAX_FILE_BYTES + 10)).unwrap();
        let errs = load_files(&[big], CompileOptions::default()).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0]
                .to_string()
                .contains("more than the 4194304 bytes allowed"),
            "{}",
            errs[0]
        );
    }

    /// A rules file of `n` rules over a few shapes (exact, wildcard, key-only, nested): a
    /// large file of the kind, ~80 bytes a rule.
    fn large_rules(n: usize) -> String {
        let limit = "rate_limit: {unit: minute, requests_per_unit: 100}";
        let mut y = String::from("domain: big\ndescriptors:\n");
        for i in 0..n {
            y += &match i % 4 {
                0 => format!("  - {{key: user, value: u{i}, {limit}}}\n"),
                1 => format!("  - {{key: host, value: \"*.h{i}.example.com\", {limit}}}\n"),
                2 => format!("  - {{key: k{i}, {limit}}}\n"),
                _ => format!("  - key: t{i}\n    descriptors:\n      - {{key: path, value: \"/p{i}/*\", {limit}}}\n"),
            };
        }
        y
    }

    #[tokio::test(flavor = "current_thread")]
    async fn other_tasks_run_while_a_large_reload_compiles() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, large_rules(20_000)).unwrap();
        let clock = Arc::new(crate::core::clock::ManualClock::new(
            crate::core::clock::UnixMillis(0),
        ));
        let limiter = RateLimiter::local(
            "domain: d\ndescriptors: []\n",
            clock,
            crate::rls::Options::default(),
        )
        .unwrap();
        let status = ReloadStatus::default();
        // One runtime thread: another task (an honest call's, here a counter) runs during
        // the reload only if the reload gives the thread back while it parses and compiles.
        let reloading = Arc::new(AtomicBool::new(true));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let (reloading, ticks) = (reloading.clone(), ticks.clone());
            async move {
                while reloading.load(Ordering::Relaxed) {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });
        assert!(reload(&path, CompileOptions::default(), &limiter, &status).await);
        let during = ticks.load(Ordering::Relaxed);
        reloading.store(false, Ordering::Relaxed);
        ticker.await.unwrap();
        assert_eq!(limiter.rules().rules.rules().len(), 20_000);
        assert!(
            during > 0,
            "the runtime's only thread was held for the whole reload"
        );
    }

    #[tokio::test]
    async fn reads_of_the_directory_are_not_changes() {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("a.yaml");
        std::fs::write(&rules, "domain: d\ndescriptors: []\n").unwrap();
        let (_watcher, mut rx) = watch_changes(dir.path()).unwrap();
        // Everything a reader does: list, open, read, stat, and a whole load (what a reload
        // does). inotify reports all of these; none may count.
        for _ in 0..20 {
            std::fs::read_to_string(&rules).unwrap();
            std::fs::read_dir(dir.path()).unwrap().for_each(drop);
            load_path(dir.path(), CompileOptions::default()).unwrap();
        }
        // Then a real change. Events arrive in order, so had a read counted, it would come first.
        let marker = dir.path().join("b.yaml");
        std::fs::write(&marker, "domain: e\ndescriptors: []\n").unwrap();
        let paths = next_paths(&mut rx).await;
        assert!(paths.contains(&marker), "first event was {paths:?}");
    }

    #[tokio::test]
    async fn a_configmap_swap_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("..v1")).unwrap();
        std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
        let (_watcher, mut rx) = watch_changes(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("..v2")).unwrap();
        std::os::unix::fs::symlink("..v2", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        // Creating ..v2 comes first; the swap itself must be seen too.
        let data = dir.path().join("..data");
        loop {
            if next_paths(&mut rx).await.contains(&data) {
                break;
            }
        }
    }
}
