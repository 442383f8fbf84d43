//! The gRPC port's HTTP/2 connections, served by hyper: `ShouldRateLimit` goes straight to
//! its call (`rls_unary`), every other path to tonic's routes (health, reflection, the quota
//! service, the RLS service's other methods), each request under the in-flight bound and its
//! deadline ([`InflightLimit`]).
//!
//! Why not tonic's `Server`: for every request it clones its stack of services and walks it
//! (a tracing span, the connection's address in the request, error recovery, load shedding
//! and concurrency limits left off, `grpc-timeout`, the router's boxed services), about a
//! tenth of the CPU a request costs on the gRPC port (`benches/cpu.sh`, docs/performance.md).
//! What of it sluice uses is here: the HTTP/2 settings tonic gives hyper, `grpc-timeout`, and
//! the graceful shutdown (stop accepting, let each connection finish its calls, wait for all).
//! One setting differs: hyper's bound on streams a client makes the server reset (1,024
//! before the connection is closed) stays on, where tonic turns it off.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::body::Body;
use tonic::service::Routes;
use tower::ServiceExt;

use crate::server::grpc::{BoxFuture, RlsService, METHOD};
use crate::server::grpc_conn::{Answer, Guarded, InflightLimit};
use crate::server::rls_unary;

/// A request's way through the port: `ShouldRateLimit` to the RLS call, anything else to
/// tonic's routes; both under the in-flight bound.
#[derive(Clone)]
pub(crate) struct Dispatch {
    rls: RlsService,
    routes: Routes,
    inflight: InflightLimit,
}

impl Dispatch {
    /// `rls` for `ShouldRateLimit`, `routes` (prepared) for the rest.
    pub(crate) fn new(rls: RlsService, routes: Routes, inflight: InflightLimit) -> Self {
        Dispatch {
            rls,
            routes,
            inflight,
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for Dispatch {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer<BoxFuture<Response<Body>>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let client = grpc_timeout(req.headers());
        let req = req.map(Body::new);
        let answer: BoxFuture<Response<Body>> = if req.uri().path() == METHOD {
            Box::pin(rls_unary::call(self.rls.clone(), req))
        } else {
            let routes = self.routes.clone();
            Box::pin(async move {
                match routes.oneshot(req).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            })
        };
        self.inflight.admit(client, answer)
    }
}

/// Serves each connection of `incoming` with `dispatch`, at most `max_concurrent_streams`
/// streams each, until `stop`; then stops accepting (dropping `incoming`), lets every
/// connection finish its calls (HTTP/2 `GOAWAY`), and returns when all have closed.
pub(crate) async fn serve<C>(
    mut incoming: ReceiverStream<Result<Guarded<C>, io::Error>>,
    dispatch: Dispatch,
    max_concurrent_streams: u32,
    stop: impl Future<Output = ()>,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // tonic's settings: hyper's defaults, its timer (keep-alive and header timeouts need one).
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(max_concurrent_streams);
    let conns = TaskTracker::new();
    let closing = CancellationToken::new();
    let mut stop = pin!(stop);
    loop {
        let io = tokio::select! {
            _ = &mut stop => break,
            io = incoming.next() => match io {
                Some(Ok(io)) => io,
                Some(Err(_)) => continue,
                None => break,
            },
        };
        let conn = builder.serve_connection(TokioIo::new(io), dispatch.clone());
        conns.spawn(connection(conn, closing.clone()));
    }
    // The listener closes: new connections are refused while the open ones finish.
    drop(incoming);
    closing.cancel();
    conns.close();
    conns.wait().await;
}

/// One connection until it ends, closed gracefully once `closing` is cancelled.
async fn connection<C>(
    conn: hyper::server::conn::http2::Connection<TokioIo<Guarded<C>>, Dispatch, TokioExecutor>,
    closing: CancellationToken,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut conn = pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        _ = closing.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "gRPC connection failed");
    }
}

/// The client's deadline (`grpc-timeout`, gRPC over HTTP/2): at most 8 digits and a unit;
/// a malformed value is ignored, as tonic ignores it.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The header, by name (parsed once, not per request).
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_TIMEOUT, value.parse().unwrap());
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeout_reads_every_unit_and_ignores_what_is_malformed() {
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout("20S"), Some(Duration::from_secs(20)));
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "20", "20x", "123456789m", "-1m", "1 m", "1.5S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
