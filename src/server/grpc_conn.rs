//! The gRPC port's connections and the bounds on what one client can make the server hold:
//! connections accepted under a cap kept below the open-files limit, the TLS handshake and
//! the HTTP/2 preface under one deadline, a connection closed when its client sends nothing
//! for the idle timeout, streams per connection (applied by hyper, `grpc_serve.rs`), and requests in flight
//! across the process and a deadline per request ([`InflightLimit`]).
//!
//! Why not tonic's own accept loop: it accepts without bound, keeps a connection that never
//! sends a byte forever (5,000 such sockets used up the descriptors: new Envoy connections,
//! `/healthcheck` and rules reloads then failed), and, out of descriptors, retries `accept`
//! at once without a log line, spinning a core. Here a connection holds a permit of a
//! semaphore until its socket is dropped; at the cap the loop stops accepting, and
//! connections wait in the kernel's accept queue, costing no descriptor.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// First pause after a failed `accept` (out of descriptors and the like), doubling up to a
/// second: retrying at once would only spin and flood the log.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The client's first bytes on an HTTP/2 connection (RFC 9113 §3.4): until they have all
/// arrived the connection is still starting, under the handshake deadline.
const PREFACE_BYTES: usize = 24;

/// Bounds on the gRPC port (settings `GRPC_MAX_CONNECTIONS`, `GRPC_MAX_CONCURRENT_STREAMS`,
/// `GRPC_MAX_CONCURRENT_REQUESTS`, `GRPC_REQUEST_TIMEOUT`, `GRPC_HANDSHAKE_TIMEOUT`,
/// `GRPC_IDLE_TIMEOUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Most connections served at once (and never more than the open-files limit allows).
    pub max_connections: usize,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`: requests one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Requests in flight across every connection; past it a request is answered at once
    /// with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    /// Longest a request may take, its body's arrival included (answered CANCELLED past it).
    pub request_timeout: Duration,
    /// Time from accept to the end of the TLS handshake and the HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// A connection whose client sends no byte for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for GrpcLimits {
    /// Each default is far from what an Envoy fleet needs and close enough to bound memory.
    /// 4,096 connections: an Envoy opens one per worker thread (a few hundred Envoys of 8
    /// workers), and the cap is lowered to fit the open-files limit anyway. 100 streams: the
    /// RFC's recommended least; an Envoy worker keeps a handful in flight (its rate-limit
    /// timeout is 20 ms) and opens another connection past the limit. 10,000 requests in
    /// flight: at 100k requests a second that is 100 ms each, five times Envoy's timeout; a
    /// held request costs ~9 KB, so they bound the memory to ~90 MB. 10 s per request: an
    /// exact rule waits on Redis for at most its 100 ms timeout. 10 s for a handshake, as
    /// the admin port gives a header. 5 minutes idle: Envoy reconnects on its next request.
    fn default() -> Self {
        GrpcLimits {
            max_connections: 4096,
            max_concurrent_streams: 100,
            max_concurrent_requests: 10_000,
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// The listener's connections, each after `handshake` (TLS, or nothing), for
/// `grpc_serve::serve` (or tonic's `serve_with_incoming`). At most `max_connections` live
/// at once; each handshake runs in a task of its own, so a slow client delays no other; a
/// failed or late one is logged at debug (scanners and probes fail them routinely) and
/// never reaches the server. Accepting stops when the stream is dropped.
pub fn incoming<C, F, Fut>(
    listener: TcpListener,
    limits: GrpcLimits,
    handshake: F,
) -> ReceiverStream<Result<Guarded<C>, io::Error>>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<C>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::spawn(async move {
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let slot = tokio::select! {
                _ = tx.closed() => return,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return, // never closed
                },
            };
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "gRPC accept failed");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                },
            };
            backoff = ACCEPT_BACKOFF_MIN;
            let _ = tcp.set_nodelay(true);
            let deadline = Instant::now() + limits.handshake_timeout;
            let (conn, tx) = (handshake(tcp), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout_at(deadline, conn).await {
                    Ok(Ok(c)) => {
                        let _ = tx.send(Ok(Guarded::new(c, slot, deadline, limits))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "gRPC handshake failed"),
                    Err(_) => tracing::debug!(%peer, "gRPC handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// A connection under its bounds: it holds its slot until dropped, fails its reads (so the
/// server drops it) when the HTTP/2 preface is not in by the handshake deadline or when the
/// client has sent nothing for the idle timeout.
pub struct Guarded<C> {
    inner: C,
    _slot: OwnedSemaphorePermit,
    /// Preface bytes still to come; the deadline is armed while any are.
    preface_left: usize,
    deadline: Pin<Box<Sleep>>,
    /// When the client last sent a byte. The timer is re-armed from it only when it fires,
    /// not on every read.
    last_read: Instant,
    idle_timeout: Duration,
    /// The waker the deadline was last polled with: while it still wakes this task and the
    /// deadline has not passed, the timer holds it and need not be polled again. A read
    /// comes back pending a few times a request, and polling the timer each time cost
    /// some 300 instructions a request (`benches/cpu.sh`, `MODE=instructions`).
    armed: Option<Waker>,
}

impl<C> Guarded<C> {
    fn new(inner: C, slot: OwnedSemaphorePermit, deadline: Instant, limits: GrpcLimits) -> Self {
        Guarded {
            inner,
            _slot: slot,
            preface_left: PREFACE_BYTES,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            last_read: Instant::now(),
            idle_timeout: limits.idle_timeout,
            armed: None,
        }
    }

    /// While no byte arrives: whether the connection is past its preface deadline or idle.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        let armed = self.armed.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if armed && !self.deadline.is_elapsed() {
            return None;
        }
        self.armed = None;
        loop {
            // Out of tokio's budget a timer is pending without taking the waker: it is
            // polled again next time.
            let registers = tokio::task::coop::has_budget_remaining();
            if self.deadline.as_mut().poll(cx).is_pending() {
                if registers {
                    self.armed = Some(cx.waker().clone());
                }
                return None;
            }
            if self.preface_left > 0 {
                return Some("no HTTP/2 preface before the handshake timeout");
            }
            let idle_until = self.last_read + self.idle_timeout;
            if Instant::now() >= idle_until {
                return Some("idle past the idle timeout");
            }
            self.deadline.as_mut().reset(idle_until);
        }
    }
}

impl<C: Connected> Connected for Guarded<C> {
    type ConnectInfo = C::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for Guarded<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    self.last_read = Instant::now();
                    if self.preface_left > 0 {
                        self.preface_left = self.preface_left.saturating_sub(read);
                        if self.preface_left == 0 {
                            let idle_until = self.last_read + self.idle_timeout;
                            self.deadline.as_mut().reset(idle_until);
                            self.armed = None;
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.expired(cx) {
                Some(why) => {
                    tracing::debug!(why, "gRPC connection closed");
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
                }
                None => Poll::Pending,
            },
            failed => failed,
        }
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Guarded<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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

/// A request's two bounds: it is answered RESOURCE_EXHAUSTED at once when
/// `max_concurrent_requests` are in flight (a request is held from its headers until its
/// answer, so streams opened and never finished would otherwise hold memory up to
/// connections × streams each), and CANCELLED past its deadline, as tonic's own timeout
/// answers. The deadline is `request_timeout`, or the client's `grpc-timeout` when shorter;
/// its timer is made only when the answer is not ready at its first poll, and a local
/// decision whose body came with its headers is (some 500 instructions a request fewer than
/// a timer for every request, `benches/cpu.sh` `MODE=instructions`). The deadline counts from
/// that first poll, which hyper makes as the request's headers arrive.
#[derive(Debug, Clone)]
pub struct InflightLimit {
    slots: Arc<Semaphore>,
    max: usize,
    timeout: Duration,
}

impl InflightLimit {
    /// A limit of `max` requests in flight (at least 1), each answered within `timeout`.
    pub fn new(max: usize, timeout: Duration) -> Self {
        InflightLimit {
            slots: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            timeout,
        }
    }

    /// Resolves once no request is in flight (taking every slot, so none starts after). A
    /// streaming call counts only until its handler returns the stream: shutdown waits here
    /// for the unary calls while the quota streams stay open for the final flush.
    pub async fn drained(&self) {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        if let Ok(slots) = self.slots.acquire_many(all).await {
            slots.forget();
        }
    }

    /// `answer` under the bound, within the request timeout or `client` (the request's
    /// `grpc-timeout`) when that is shorter.
    pub(crate) fn admit<F>(&self, client: Option<Duration>, answer: F) -> Answer<F> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => Answer::Admitted {
                answer,
                deadline: None,
                timeout: client.map_or(self.timeout, |c| c.min(self.timeout)),
                _slot: slot,
            },
            Err(_) => Answer::Refused,
        }
    }
}

/// [`InflightLimit`]'s answer: the service's, holding its slot until dropped, under the
/// deadline; or the refusal.
pub enum Answer<F> {
    /// In flight.
    Admitted {
        answer: F,
        /// Armed at the first poll that finds the answer not ready.
        deadline: Option<Pin<Box<Sleep>>>,
        timeout: Duration,
        _slot: OwnedSemaphorePermit,
    },
    /// Past `max_concurrent_requests`.
    Refused,
}

impl<F> Future for Answer<F>
where
    F: Future<Output = http::Response<tonic::body::Body>> + Unpin,
{
    type Output = Result<http::Response<tonic::body::Body>, std::convert::Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Answer::Refused => Poll::Ready(Ok(tonic::Status::resource_exhausted(
                "too many requests in flight (GRPC_MAX_CONCURRENT_REQUESTS)",
            )
            .into_http())),
            Answer::Admitted {
                answer,
                deadline,
                timeout,
                ..
            } => {
                if let Poll::Ready(r) = Pin::new(answer).poll(cx) {
                    return Poll::Ready(Ok(r));
                }
                let timeout = *timeout;
                let deadline =
                    deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match deadline.as_mut().poll(cx) {
                    // tonic's answer past its own timeout (`Status::from_error`).
                    Poll::Ready(()) => {
                        Poll::Ready(Ok(tonic::Status::cancelled("Timeout expired").into_http()))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}
