//! The unary path held to envoy-types' generated server (tonic's `Grpc::unary` with prost's
//! codec) on the same limiter state: for valid requests and for every way a request can
//! leave the common case (split frames, compression flags, lengths past the bound, two
//! messages, trailers, body errors, `grpc-encoding`, malformed protobuf, a refused request),
//! the same status line, headers, body bytes and trailers.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tower::{Service, ServiceExt};

use super::*;
use crate::core::clock::ManualClock;
use crate::core::UnixMillis;
use crate::rls::{Options, RateLimiter};
use crate::server::grpc::RlsService;

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
"#;

/// The generated server over the same answer, as sluice served it before.
struct Reference(RlsService);

#[async_trait::async_trait]
impl RateLimitService for Reference {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, Status> {
        self.0
            .answer(request.get_ref())
            .await
            .map(tonic::Response::new)
    }
}

fn service() -> RlsService {
    let clock = Arc::new(ManualClock::new(UnixMillis(1_700_006_400_000)));
    RlsService::new(RateLimiter::local(RULES, clock, Options::default()).unwrap())
}

fn message(domain: &str, entries: &[(&str, &str)]) -> Vec<u8> {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    }
    .encode_to_vec()
}

/// A gRPC frame: `flag`, the length given, the bytes.
fn framed(flag: u8, len: u32, bytes: &[u8]) -> Vec<u8> {
    let mut f = vec![flag];
    f.extend(len.to_be_bytes());
    f.extend(bytes);
    f
}

fn whole(bytes: &[u8]) -> Vec<u8> {
    framed(0, bytes.len() as u32, bytes)
}

type Case = (
    Vec<(&'static str, &'static str)>,
    Vec<Result<Frame<Bytes>, Status>>,
);

fn data(b: &[u8]) -> Result<Frame<Bytes>, Status> {
    Ok(Frame::data(Bytes::copy_from_slice(b)))
}

fn request_of(path: &str, (headers, frames): Case) -> http::Request<Body> {
    let body = Replay {
        frames: frames.into(),
        rest: None,
    };
    let mut req = http::Request::post(path).body(Body::new(body)).unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(k, v.parse().unwrap());
    }
    req
}

/// What a client receives: status, version, headers, the body's bytes, the trailers.
async fn received(res: http::Response<Body>) -> (String, Vec<u8>, Option<HeaderMap>) {
    let head = format!("{} {:?} {:?}", res.status(), res.version(), res.headers());
    let mut body = res.into_body();
    let (mut bytes, mut trailers) = (Vec::new(), None);
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        match frame.unwrap().into_data() {
            Ok(d) => bytes.extend_from_slice(&d),
            Err(f) => trailers = Some(f.into_trailers().unwrap()),
        }
    }
    (head, bytes, trailers)
}

const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Each case through both servers, in order (so both limiters count alike).
async fn same(path: &str, cases: Vec<fn() -> Case>) {
    let (ours, theirs) = (service(), service());
    let mut ours = ours.into_server();
    let mut theirs = RateLimitServiceServer::new(Reference(theirs));
    for (i, case) in cases.into_iter().enumerate() {
        let a = ours
            .ready()
            .await
            .unwrap()
            .call(request_of(path, case()))
            .await;
        let b = ServiceExt::<http::Request<Body>>::ready(&mut theirs)
            .await
            .unwrap()
            .call(request_of(path, case()))
            .await;
        let (a, b) = (received(a.unwrap()).await, received(b.unwrap()).await);
        assert_eq!(a, b, "case {i}");
    }
}

#[tokio::test]
async fn answers_as_the_generated_server() {
    let cases: Vec<fn() -> Case> = vec![
        // Valid: OK, OK, then over the limit; unlimited; an unknown key.
        || (vec![], vec![data(&whole(&message("d", &[("user", "a")])))]),
        || (vec![], vec![data(&whole(&message("d", &[("user", "a")])))]),
        || (vec![], vec![data(&whole(&message("d", &[("user", "a")])))]),
        || (vec![], vec![data(&whole(&message("d", &[("free", "x")])))]),
        || (vec![], vec![data(&whole(&message("d", &[("other", "x")])))]),
        // Split inside the prefix and inside the message.
        || {
            let f = whole(&message("d", &[("user", "b")]));
            (vec![], vec![data(&f[..2]), data(&f[2..9]), data(&f[9..])])
        },
        // An empty chunk after the message, and one before it.
        || {
            let f = whole(&message("d", &[("user", "b")]));
            (vec![], vec![data(&f), data(&[])])
        },
        || {
            let f = whole(&message("d", &[("user", "b")]));
            (vec![], vec![data(&[]), data(&f)])
        },
        // Refused by the limiter: an empty domain, no descriptors.
        || (vec![], vec![data(&whole(&message("", &[("user", "a")])))]),
        || (vec![], vec![data(&whole(&[]))]),
        // Malformed protobuf: truncated inside, a string not UTF-8.
        || {
            let m = message("d", &[("user", "a")]);
            (vec![], vec![data(&whole(&m[..m.len() - 1]))])
        },
        || (vec![], vec![data(&whole(&[10, 2, 0xff, 0xfe]))]),
        // The frame: empty body, a short prefix, a short message, two messages.
        || (vec![], vec![]),
        || (vec![], vec![data(&[0, 0, 0])]),
        || {
            let m = message("d", &[("user", "c")]);
            (vec![], vec![data(&framed(0, m.len() as u32 + 1, &m))])
        },
        || {
            let mut f = whole(&message("d", &[("user", "c")]));
            f.extend(whole(&message("d", &[("user", "c")])));
            (vec![], vec![data(&f)])
        },
        || {
            let mut f = whole(&message("d", &[("user", "c")]));
            f.extend(whole(&[0xff]));
            (vec![], vec![data(&f)])
        },
        // Compression flags, with and without grpc-encoding; a length past 4 MiB.
        || (vec![], vec![data(&framed(1, 3, b"abc"))]),
        || (vec![], vec![data(&framed(2, 3, b"abc"))]),
        || (vec![], vec![data(&framed(0, 4 * 1024 * 1024 + 1, b"abc"))]),
        || {
            let f = whole(&message("d", &[("user", "e")]));
            (vec![("grpc-encoding", "gzip")], vec![data(&f)])
        },
        || {
            let f = whole(&message("d", &[("user", "e")]));
            (vec![("grpc-encoding", "identity")], vec![data(&f)])
        },
        // Client trailers after a valid message; a body that fails, before and after one.
        || {
            let f = whole(&message("d", &[("user", "f")]));
            let mut t = HeaderMap::new();
            t.insert("x-t", "1".parse().unwrap());
            (vec![], vec![data(&f), Ok(Frame::trailers(t))])
        },
        || (vec![], vec![Err(Status::internal("reset"))]),
        || {
            let f = whole(&message("d", &[("user", "g")]));
            (vec![], vec![data(&f), Err(Status::cancelled("gone"))])
        },
        || {
            let f = whole(&message("d", &[("user", "g")]));
            (vec![], vec![data(&f), Err(Status::internal("reset"))])
        },
    ];
    same(METHOD, cases).await;
}

#[tokio::test]
async fn other_methods_are_unimplemented_as_before() {
    let cases: Vec<fn() -> Case> = vec![|| (vec![], vec![])];
    same("/envoy.service.ratelimit.v3.RateLimitService/Other", cases).await;
}

#[tokio::test]
async fn the_usual_request_is_read_here() {
    let f = whole(&message("d", &[("user", "a")]));
    for frames in [
        vec![data(&f)],
        vec![data(&f[..3]), data(&f[3..])],
        vec![data(&f), data(&[])],
    ] {
        let mut body = Body::new(Replay {
            frames: frames.into(),
            rest: None,
        });
        assert_eq!(read_one(&mut body).await.unwrap(), f);
    }
    let mut two = f.clone();
    two.extend(&f);
    let mut body = Body::new(Replay {
        frames: vec![data(&two)].into(),
        rest: None,
    });
    let replayed = read_one(&mut body).await.unwrap_err();
    assert_eq!(replayed.len(), 1, "two messages go to tonic as read");
}
