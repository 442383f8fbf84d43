//! The task supervisor of global mode: every background task (a shard's sync, the clock
//! offset) runs under [`supervise`], which logs, counts and reports a task that panics or ends
//! before shutdown, and starts it again with backoff.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::core::clock::Clock;
use crate::global::{ShardHealth, SyncStats};

/// First wait before restarting a stopped task, doubling up to the most; a task that ran
/// longer than the most before stopping starts again from the first.
const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(500);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What [`supervise`] watches and where it reports.
pub(super) struct Watch {
    /// The task, for logs and the degraded reason ("sync task", "clock-offset task").
    pub(super) task: &'static str,
    /// The shard the task serves, marked degraded while it is down.
    pub(super) shard: Option<Arc<ShardHealth>>,
    pub(super) clock: Arc<dyn Clock>,
    /// Where stopped tasks are counted (`task_failures`).
    pub(super) stats: Arc<SyncStats>,
    /// Shutdown: the only time a task may end.
    pub(super) stop: CancellationToken,
}

/// Runs the task `start` makes until it ends after `stop`. One that panics or returns before
/// `stop` is logged, counted, marks its shard degraded, and is started again after a backoff.
///
/// Restarting rather than exiting the process: a sync task's state lives outside it (the
/// queues, and entities whose unsettled deltas the task's in-flight guard puts back when it
/// unwinds), so a new task picks up where the old one stopped, while the process keeps
/// answering from memory as it does when Redis is down; exiting would drop every node's
/// unsynced hits and every open Envoy connection over what may be one bad reply. If `stop`
/// comes during the backoff the task is still started once, to make its final flush.
pub(super) async fn supervise<F, Fut>(w: Watch, start: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let shard = w.shard.as_ref().map(|h| h.name.clone()).unwrap_or_default();
    let mut backoff = RESTART_BACKOFF_MIN;
    loop {
        let started = tokio::time::Instant::now();
        let why = match tokio::spawn(start()).await {
            Ok(()) if w.stop.is_cancelled() => return,
            Ok(()) => "ended unexpectedly".to_string(),
            Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e.into_panic())),
            Err(e) => e.to_string(),
        };
        let reason = format!("{} stopped: {why}", w.task);
        w.stats.task_failures.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = &w.shard {
            h.failed(&reason, w.clock.now());
        }
        if w.stop.is_cancelled() {
            tracing::error!(shard = %shard, error = %reason, "stopped during shutdown; not restarted, its unsent hits are lost");
            return;
        }
        if started.elapsed() > RESTART_BACKOFF_MAX {
            backoff = RESTART_BACKOFF_MIN;
        }
        tracing::error!(shard = %shard, error = %reason, restart_in = ?backoff, "background task stopped; restarting it");
        tokio::select! {
            _ = w.stop.cancelled() => {}
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// The message of a panic payload (a `&str` or a `String` for `panic!` with a message).
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_string(), |s| (*s).to_string()),
    }
}
