//! The admin port's connections: accepting them under a cap, serving each with HTTP/1.1 under a
//! header-read timeout and an idle timeout, and closing them all on shutdown.
//!
//! Why not `axum::serve`: it accepts without bound and keeps every connection until the client
//! goes, so a thousand idle sockets on the admin port once used up the process's file
//! descriptors and Envoy's new gRPC connections to the same process timed out. Here every
//! admin connection holds a permit of a semaphore, is dropped by hyper when it sends no full
//! header in time (hyper restarts that timer while it waits for the next request on a kept-alive
//! connection, so an idle kept-alive connection is closed by it too), and is dropped when no
//! byte moves either way for the idle timeout (a stalled body upload or a client that never
//! reads its response).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// First pause after a failed `accept` (EMFILE and the like), doubling up to a second: the
/// condition is usually transient, and retrying at once would only spin and flood the log.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Bounds on the admin port's connections (settings map `HTTP_HEADER_READ_TIMEOUT`,
/// `HTTP_IDLE_TIMEOUT` and `HTTP_MAX_CONNECTIONS` to them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest wait for a request's full header, counted from when the connection starts
    /// waiting for it (on accept, and after each response on a kept-alive connection).
    pub header_read_timeout: Duration,
    /// A connection on which no byte moves either way for this long is closed.
    pub idle_timeout: Duration,
    /// Most connections served at once; further ones wait in the kernel's accept queue.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    /// 10 s for a header: probes, scrapers and curl send theirs in one packet, and 10 s still
    /// tolerates a slow link while bounding how long a slow-header client holds a slot.
    /// 60 s idle: well above any response this port writes (a large `/metrics` on a slow
    /// link), while freeing slots held by clients that stall mid-body or stop reading.
    /// 256 connections: the port's real clients (kubelet probes, a Prometheus or two, an
    /// operator) need a handful; 256 leaves them ample room and is a quarter of the common
    /// 1024 open-files soft limit, so the rest stays for gRPC clients and Redis.
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves; then stops
/// accepting, asks every connection to close after its current response, and returns when
/// they have.
///
/// At the cap this stops accepting rather than accepting and closing at once: a connection
/// waiting in the kernel's accept queue costs the process no file descriptor, so the
/// process's descriptors stay bounded by the cap, the queue itself is bounded by the listen
/// backlog, and a waiting client (a kubelet probe, say) is served as soon as a slot frees
/// instead of being refused and having to retry.
///
/// # Errors
/// None today: a failed `accept` (out of descriptors, a connection reset before it was
/// accepted) is logged and retried with backoff, because the admin port must come back on
/// its own once the condition passes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let conns = TaskTracker::new();
    let closing = CancellationToken::new();
    let mut shutdown = pin!(shutdown);
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let slot = tokio::select! {
            _ = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed; nothing left to serve if it were
            },
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "HTTP accept failed");
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
        };
        backoff = ACCEPT_BACKOFF_MIN;
        conns.spawn(serve_conn(
            stream,
            peer,
            router.clone(),
            limits,
            closing.clone(),
            slot,
        ));
    }
    // Closing the listener refuses new connections while the open ones finish.
    drop(listener);
    closing.cancel();
    conns.close();
    conns.wait().await;
    Ok(())
}

/// Serves one connection until the client closes it, hyper gives up on it (header timeout,
/// protocol error), it idles past the limit, or it finishes draining after `closing`. The
/// slot is released when this returns, with the socket closed.
async fn serve_conn(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: HttpLimits,
    closing: CancellationToken,
    _slot: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    // The peer's address, for the handlers that log who asked (`POST /reset`).
    let router = router.map_request(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    });
    let mut conn = pin!(builder.serve_connection(io, TowerToHyperService::new(router)));
    let mut idle = pin!(activity.idle_for(limits.idle_timeout));
    let mut draining = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "HTTP connection closed");
                }
                return;
            }
            _ = closing.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = idle.as_mut() => {
                tracing::debug!(idle = ?limits.idle_timeout, "HTTP connection idle; closing");
                return;
            }
        }
    }
}

/// When bytes last moved on a connection, in ms since it opened (atomic, so the I/O path
/// never locks).
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let last = self.last_ms.load(Ordering::Relaxed);
            tokio::time::sleep_until(self.opened + Duration::from_millis(last) + timeout).await;
            if self.last_ms.load(Ordering::Relaxed) == last {
                return;
            }
        }
    }
}

/// A socket that records in [`Activity`] every read or write that moves bytes.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
