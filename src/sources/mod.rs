//! Where the rules come from: files on disk, loaded at start and reloaded when they change
//! (`files.rs`), or an xDS management server (`xds/`). What both share is here: a load
//! compiled and swapped in off the serving threads ([`load_and_swap`]), the replaced set
//! dropped where no request pays for it, and the count of loads ([`ReloadStatus`], with
//! `sluice_config_load_total`) that `/rlconfig/status` and readiness report.

pub mod files;
pub mod xds;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::core::clock::UnixMillis;
use crate::rls::RateLimiter;
use crate::rules::model::ConfigError;
use crate::rules::RuleSet;
use crate::telemetry::ConfigLoad;

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

    pub(crate) fn succeeded(&self) {
        let mut s = self.inner.lock();
        s.loads += 1;
        s.errors.clear();
        s.errors_since = None;
    }

    pub(crate) fn failed(&self, errors: Vec<String>, now: UnixMillis) {
        let mut s = self.inner.lock();
        s.errors = errors;
        s.errors_since.get_or_insert(now);
    }

    /// Counts a load that was applied, from a file or over xDS: here and in
    /// `sluice_config_load_total{result="success"}`.
    pub(crate) fn count_success(&self, limiter: &RateLimiter) {
        limiter.telemetry().config_load(ConfigLoad::Success);
        self.succeeded();
    }

    /// Counts a load that was rejected (the rules in force stay), with its errors: here and
    /// in `sluice_config_load_total{result="error"}`.
    pub(crate) fn count_failure(&self, limiter: &RateLimiter, errors: Vec<String>) {
        limiter.telemetry().config_load(ConfigLoad::Error);
        self.failed(errors, limiter.now());
    }
}

/// What a load put in force.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    /// Rules compiled.
    pub rules: usize,
    /// Domains with rules.
    pub domains: usize,
    /// Files (or xDS resources) they came from.
    pub files: usize,
}

/// Runs `load` (read, parse, validate, compile) and puts its rules in force, on a blocking
/// thread: a 4 MiB file of 40k rules takes most of a second, which on a runtime worker is a
/// second in which no request on that worker is answered. The swap is the same one atomic
/// store. The set it replaces is dropped on a blocking thread too, once no request holds it.
///
/// # Errors
/// The load's errors; the rules in force stay.
pub async fn load_and_swap<F>(
    limiter: &Arc<RateLimiter>,
    load: F,
) -> Result<Loaded, Vec<ConfigError>>
where
    F: FnOnce() -> Result<(RuleSet, Vec<String>), Vec<ConfigError>> + Send + 'static,
{
    let limiter = limiter.clone();
    let task = tokio::task::spawn_blocking(move || {
        let (set, files) = load()?;
        let loaded = Loaded {
            rules: set.rules().len(),
            domains: set.domain_count(),
            files: files.len(),
        };
        let old = limiter.swap_rules(set, files);
        // Not waited for: an ACK to the management server or the next reload need not wait
        // for the old set to go.
        tokio::task::spawn_blocking(move || retire(old));
        Ok(loaded)
    });
    task.await.unwrap_or_else(|e| {
        // Compiling never panics (the fuzz targets hold it to that); a runtime shutting
        // down cancels the task before it starts.
        Err(vec![ConfigError::new(
            "rules",
            format!("the load did not finish: {e}"),
        )])
    })
}

/// How long a replaced rule set waits for the requests that still read it before it is
/// dropped here anyway (then by the last of them): a request reads it for microseconds, or
/// for a Redis round trip on the exact path.
const RETIRE_WAIT: Duration = Duration::from_secs(5);

/// Drops a replaced rule set once this is its last reference, so that freeing tens of
/// thousands of rules happens on this (blocking) thread, not on a request's.
fn retire<T>(old: Arc<T>) {
    let step = Duration::from_millis(5);
    let mut waited = Duration::ZERO;
    // The swap made every reader's hold a real reference (arc-swap pays its readers' debts
    // on a swap), so the count is exact.
    while Arc::strong_count(&old) > 1 && waited < RETIRE_WAIT {
        std::thread::sleep(step);
        waited += step;
    }
    drop(old);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_set_is_dropped_by_the_retiring_thread_not_its_last_reader() {
        struct Recorded(Arc<Mutex<Option<std::thread::ThreadId>>>);
        impl Drop for Recorded {
            fn drop(&mut self) {
                *self.0.lock() = Some(std::thread::current().id());
            }
        }
        let dropped_on = Arc::new(Mutex::new(None));
        let old = Arc::new(Recorded(dropped_on.clone()));
        let reader = old.clone();
        let retiring = std::thread::spawn(move || retire(old));
        // The reader lets go while the retiring thread waits, or before it looks: either
        // way the last reference, and the drop, are the retiring thread's.
        drop(reader);
        let retiring_id = retiring.thread().id();
        retiring.join().unwrap();
        assert_eq!(*dropped_on.lock(), Some(retiring_id));
    }
}
