//! gRPC reflection on the real server: what it lists (the services registered, itself
//! included; the quota service only when it is on) and what it resolves from the vendored
//! descriptor set (the RLQS protos, by symbol and by file, whether or not the service is on).

use std::collections::BTreeSet;

use envoy_types::pb::google::protobuf::FileDescriptorProto;
use prost::Message as _;
use sluice::server::grpc::{RLQS_SERVICE, RLS_SERVICE};
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};
use v1::server_reflection_client::ServerReflectionClient;
use v1::server_reflection_request::MessageRequest;
use v1::server_reflection_response::MessageResponse;
use v1::ServerReflectionRequest;

use crate::common::Server;

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

/// A plaintext channel to `s`'s gRPC port.
async fn channel(s: &Server) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", s.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The v1 reflection service's answer to `request`, alone on a stream.
async fn ask(channel: &Channel, request: MessageRequest) -> MessageResponse {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut stream = ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    stream
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap()
}

/// The services v1 reflection lists.
async fn listed_v1(channel: &Channel) -> Vec<String> {
    let MessageResponse::ListServicesResponse(list) =
        ask(channel, MessageRequest::ListServices(String::new())).await
    else {
        panic!("expected a service list")
    };
    list.service.into_iter().map(|s| s.name).collect()
}

/// The services v1alpha reflection lists.
async fn listed_v1alpha(channel: &Channel) -> Vec<String> {
    use v1alpha::server_reflection_request::MessageRequest;
    use v1alpha::server_reflection_response::MessageResponse;
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream =
        v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone())
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        stream.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list")
    };
    list.service.into_iter().map(|s| s.name).collect()
}

/// The one file a reflection answer holds (tonic's answers hold the file asked for alone;
/// a client fetches the imports by name).
fn one_file(response: MessageResponse) -> FileDescriptorProto {
    let MessageResponse::FileDescriptorResponse(files) = response else {
        panic!("expected file descriptors, got {response:?}")
    };
    assert_eq!(files.file_descriptor_proto.len(), 1);
    FileDescriptorProto::decode(&*files.file_descriptor_proto[0]).unwrap()
}

#[tokio::test]
async fn reflection_lists_the_served_services_and_itself() {
    let s = Server::start(RULES, |_| {}).await;
    let ch = channel(&s).await;
    let v1 = listed_v1(&ch).await;
    for name in [RLS_SERVICE, "grpc.reflection.v1.ServerReflection"] {
        assert!(v1.iter().any(|n| n == name), "{name} in {v1:?}");
    }
    let v1alpha = listed_v1alpha(&ch).await;
    for name in [RLS_SERVICE, "grpc.reflection.v1alpha.ServerReflection"] {
        assert!(v1alpha.iter().any(|n| n == name), "{name} in {v1alpha:?}");
    }
    assert_eq!(v1.iter().collect::<BTreeSet<_>>().len(), v1.len(), "{v1:?}");
    s.stop().await.unwrap();
}

/// The quota service is listed when it is served (the default), and not with
/// `RLQS_ENABLED=false`: a client should not discover a service that answers `UNIMPLEMENTED`.
#[tokio::test]
async fn reflection_lists_rlqs_only_when_it_is_served() {
    let s = Server::start(RULES, |_| {}).await;
    let ch = channel(&s).await;
    let v1 = listed_v1(&ch).await;
    assert!(v1.iter().any(|n| n == RLQS_SERVICE), "{v1:?}");
    let v1alpha = listed_v1alpha(&ch).await;
    assert!(v1alpha.iter().any(|n| n == RLQS_SERVICE), "{v1alpha:?}");
    s.stop().await.unwrap();

    let s = Server::start(RULES, |settings| settings.rlqs = None).await;
    let ch = channel(&s).await;
    let v1 = listed_v1(&ch).await;
    assert!(!v1.iter().any(|n| n == RLQS_SERVICE), "{v1:?}");
    let v1alpha = listed_v1alpha(&ch).await;
    assert!(!v1alpha.iter().any(|n| n == RLQS_SERVICE), "{v1alpha:?}");
    s.stop().await.unwrap();
}

/// The RLQS service resolves by symbol to rlqs.proto, and its imports by name, down to the
/// well-known types: a client (grpcurl) can describe and call it from reflection alone. From
/// the descriptor set, so even with the service off.
#[tokio::test]
async fn reflection_resolves_the_rlqs_protos_from_the_descriptor_set() {
    let s = Server::start(RULES, |settings| settings.rlqs = None).await;
    let ch = channel(&s).await;
    let rlqs = one_file(
        ask(
            &ch,
            MessageRequest::FileContainingSymbol(RLQS_SERVICE.into()),
        )
        .await,
    );
    assert_eq!(rlqs.name(), "envoy/service/rate_limit_quota/v3/rlqs.proto");
    let method = &rlqs.service[0].method[0];
    assert_eq!(method.name(), "StreamRateLimitQuotas");
    assert!(method.client_streaming() && method.server_streaming());
    assert_eq!(
        method.input_type(),
        ".envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports"
    );
    assert_eq!(
        method.output_type(),
        ".envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse"
    );

    // The imports, transitively, each by name.
    let mut seen = BTreeSet::from([rlqs.name().to_string()]);
    let mut pending = rlqs.dependency.clone();
    while let Some(name) = pending.pop() {
        if seen.insert(name.clone()) {
            let file = one_file(ask(&ch, MessageRequest::FileByFilename(name.clone())).await);
            assert_eq!(file.name(), name);
            pending.extend(file.dependency);
        }
    }
    let expected = [
        "envoy/service/rate_limit_quota/v3/rlqs.proto",
        "envoy/type/v3/ratelimit_strategy.proto",
        "envoy/type/v3/ratelimit_unit.proto",
        "envoy/type/v3/token_bucket.proto",
        "google/protobuf/duration.proto",
        "google/protobuf/wrappers.proto",
    ];
    assert_eq!(seen, expected.map(String::from).into());

    // A nested message resolves to its file too.
    let symbol =
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse.BucketAction.AbandonAction";
    let file = one_file(ask(&ch, MessageRequest::FileContainingSymbol(symbol.into())).await);
    assert_eq!(file.name(), rlqs.name());
    s.stop().await.unwrap();
}
