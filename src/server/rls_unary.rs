//! `ShouldRateLimit`'s call without tonic's general unary machinery, for the request every
//! Envoy sends: no `grpc-encoding`, one uncompressed message within tonic's 4 MiB, then the
//! end of the stream. Anything else is handed to `Grpc::unary` whole, the bytes already read
//! replayed ahead of the rest of the body, so tonic answers it exactly as it always did.
//!
//! Why: tonic's path builds a general request (metadata, a decoding stream with an 8 KiB
//! buffer), a general response (its metadata sanitised into headers, an encoding stream)
//! and the trailers from an `OK` status; about 4k instructions a request that the no-op pays
//! too, and that sluice's answer (the limiter, the larger response) has to make room for
//! (docs/performance.md). The answer here is what tonic sends for the same request, byte for
//! byte: the headers (`content-type: application/grpc`), one message frame, the trailers
//! (`grpc-status: 0`); a refused request is `Status::into_http`, as tonic's.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::HeaderMap;
use hyper::body::{Body as HttpBody, Frame};
use tonic::body::Body;
use tonic::server::{Grpc, UnaryService};
use tonic::Status;

use crate::server::rls_codec::{request, RlsCodec};
use crate::server::rls_write::frame_response;

/// What the call needs of the RLS service (`grpc::RlsService`): its method for tonic's
/// path, and its answer for this one.
pub(crate) trait Rls:
    UnaryService<RateLimitRequest, Response = RateLimitResponse, Future: Send> + Send + 'static
{
    /// Whether calls are traced: tracing reads the request's metadata, so tonic's path.
    fn traced(&self) -> bool;

    /// The limiter's answer to `req`.
    fn answer(
        &self,
        req: &RateLimitRequest,
    ) -> impl Future<Output = Result<RateLimitResponse, Status>> + Send;
}

/// tonic's bound on a received message (`max_decoding_message_size`'s default), checked
/// here as tonic checks it: a longer message goes to tonic, which refuses it.
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A gRPC message's prefix: the compressed flag and the length.
const PREFIX: usize = 5;

/// The request's compression, by name (a name parsed once, not per request).
const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");

/// Answers one `ShouldRateLimit` call.
pub(crate) async fn call<S: Rls>(service: S, req: http::Request<Body>) -> http::Response<Body> {
    // Tracing reads the request's metadata; a compressed request needs tonic's decoders.
    if service.traced() || req.headers().contains_key(GRPC_ENCODING) {
        return Grpc::new(RlsCodec).unary(service, req).await;
    }
    let (parts, mut body) = req.into_parts();
    let read = read_one(&mut body).await;
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(replay) => {
            let body = Replay {
                frames: replay,
                rest: Some(body),
            };
            return Grpc::new(RlsCodec)
                .unary(service, http::Request::from_parts(parts, body))
                .await;
        }
    };
    let Ok(message) = request(&bytes[PREFIX..]) else {
        // prost's error, from tonic.
        let frames = VecDeque::from([Ok(Frame::data(bytes))]);
        let body = Replay {
            frames,
            rest: Some(body),
        };
        return Grpc::new(RlsCodec)
            .unary(service, http::Request::from_parts(parts, body))
            .await;
    };
    drop(parts);
    match service.answer(&message).await {
        Ok(response) => {
            let mut res = http::Response::new(Body::new(Answer {
                message: Some(frame_response(&response)),
                done: false,
            }));
            *res.version_mut() = http::Version::HTTP_2;
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                tonic::metadata::GRPC_CONTENT_TYPE,
            );
            res
        }
        Err(status) => status.into_http(),
    }
}

type Frames = VecDeque<Result<Frame<Bytes>, Status>>;

/// The body's bytes when they are one uncompressed message of at most [`MAX_MESSAGE`] bytes
/// and nothing else (data frames only, ending the stream); else what was read, to replay.
/// Stops reading at the first thing tonic would act on itself (a flag, a length, a frame
/// that is not data), so tonic reads the rest as it would have.
async fn read_one(body: &mut Body) -> Result<Bytes, Frames> {
    let mut first = Bytes::new();
    let mut more = BytesMut::new();
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await;
        let data = match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(frame) => return Err(replay(first, more, Some(Ok(frame)))),
            },
            Some(Err(e)) => return Err(replay(first, more, Some(Err(e)))),
        };
        // An empty chunk (a client may end the stream with one) adds nothing, to tonic
        // either.
        if data.is_empty() {
            continue;
        }
        if first.is_empty() && more.is_empty() {
            first = data;
        } else {
            if more.is_empty() {
                more.extend_from_slice(&first);
                first = Bytes::new();
            }
            more.extend_from_slice(&data);
        }
        let got: &[u8] = if more.is_empty() { &first } else { &more };
        if got.len() >= PREFIX && !fits(got) {
            return Err(replay(first, more, None));
        }
    }
    let got = if more.is_empty() {
        first
    } else {
        more.freeze()
    };
    if got.len() >= PREFIX && fits(&got) && got.len() == PREFIX + length(&got) {
        Ok(got)
    } else {
        Err(replay(got, BytesMut::new(), None))
    }
}

/// Whether bytes starting with a message prefix are, so far, one uncompressed message of at
/// most [`MAX_MESSAGE`] bytes and no more.
fn fits(got: &[u8]) -> bool {
    got[0] == 0 && length(got) <= MAX_MESSAGE && got.len() <= PREFIX + length(got)
}

/// The message length a prefix gives.
fn length(got: &[u8]) -> usize {
    let mut len = &got[1..PREFIX];
    len.get_u32() as usize
}

/// What was read, as frames to hand tonic: the data so far, then `last`.
fn replay(first: Bytes, more: BytesMut, last: Option<Result<Frame<Bytes>, Status>>) -> Frames {
    let data = if more.is_empty() {
        first
    } else {
        more.freeze()
    };
    let mut frames = VecDeque::new();
    if !data.is_empty() {
        frames.push_back(Ok(Frame::data(data)));
    }
    frames.extend(last);
    frames
}

/// The request's body as tonic would have read it: the frames read already, then the rest.
struct Replay {
    frames: Frames,
    rest: Option<Body>,
}

impl HttpBody for Replay {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(frame));
        }
        match &mut self.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(HttpBody::is_end_stream)
    }
}

/// The answer's body: the message's frame, then the trailers of an `OK` status (no size
/// hint, as tonic's: the response has no `content-length`).
struct Answer {
    message: Option<Bytes>,
    done: bool,
}

impl HttpBody for Answer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        self.done = true;
        let mut trailers = HeaderMap::with_capacity(1);
        trailers.insert(Status::GRPC_STATUS, http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
#[path = "rls_unary_tests.rs"]
mod tests;
