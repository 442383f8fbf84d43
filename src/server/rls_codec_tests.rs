//! The RLS codec held to prost: for generated requests (unknown fields, repeated and merged
//! fields, mutations and truncations among them) the reader gives prost's message or prost's
//! error, and takes the well-formed ones itself; for generated responses (every field, nested
//! metadata included) the writer gives prost's bytes.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, Quota, RateLimit,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration, ListValue, Struct, Timestamp, Value};
use proptest::prelude::*;

use super::*;

/// What tonic's prost codec gives for `bytes`: the message, or `INTERNAL` with prost's text.
fn prost_decode(bytes: &[u8]) -> Result<RateLimitRequest, (tonic::Code, String)> {
    RateLimitRequest::decode(bytes).map_err(|e| {
        let s = Status::internal(e.to_string());
        (s.code(), s.message().to_owned())
    })
}

fn ours(bytes: &[u8]) -> Result<RateLimitRequest, (tonic::Code, String)> {
    let mut src = bytes;
    decode_request(&mut src).map_err(|s| (s.code(), s.message().to_owned()))
}

fn key(tag: u32, wire: u8, out: &mut Vec<u8>) {
    prost::encoding::encode_varint(u64::from(tag << 3 | u32::from(wire)), out);
}

/// An unknown field of each wire type the reader skips itself (and a group, left to prost).
fn unknown(kind: u8, tag: u32, out: &mut Vec<u8>) {
    match kind % 5 {
        0 => {
            key(tag, 0, out);
            prost::encoding::encode_varint(u64::MAX, out);
        }
        1 => {
            key(tag, 1, out);
            out.extend_from_slice(&[7; 8]);
        }
        2 => {
            key(tag, 2, out);
            out.extend_from_slice(&[3, b'a', b'b', b'c']);
        }
        3 => {
            key(tag, 5, out);
            out.extend_from_slice(&[9; 4]);
        }
        _ => {
            key(tag, 3, out);
            key(1, 0, out);
            out.push(1);
            key(tag, 4, out);
        }
    }
}

fn descriptor_strategy() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec(("\\PC{0,6}", "\\PC{0,6}"), 0..4),
        prop::option::of((any::<u32>(), -3i32..12)),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

fn request_strategy() -> impl Strategy<Value = RateLimitRequest> {
    (
        "\\PC{0,8}",
        prop::collection::vec(descriptor_strategy(), 0..4),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

fn value_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(None),
        (-2i32..3).prop_map(|x| Some(Kind::NullValue(x))),
        any::<f64>()
            .prop_filter("comparable", |x| !x.is_nan())
            .prop_map(|x| Some(Kind::NumberValue(x))),
        "\\PC{0,5}".prop_map(|s| Some(Kind::StringValue(s))),
        any::<bool>().prop_map(|b| Some(Kind::BoolValue(b))),
    ]
    .prop_map(|kind| Value { kind });
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::hash_map("\\PC{0,4}", inner.clone(), 0..4).prop_map(|fields| {
                Value {
                    kind: Some(Kind::StructValue(Struct { fields })),
                }
            }),
            prop::collection::vec(inner, 0..4).prop_map(|values| Value {
                kind: Some(Kind::ListValue(ListValue { values })),
            }),
        ]
    })
}

fn quota_strategy() -> impl Strategy<Value = Quota> {
    (
        any::<u32>(),
        prop::option::of((any::<i64>(), any::<i32>())),
        "\\PC{0,5}",
    )
        .prop_map(|(requests, until, id)| Quota {
            requests,
            expiration_specifier: until.map(|(seconds, nanos)| {
                ExpirationSpecifier::ValidUntil(Timestamp { seconds, nanos })
            }),
            id,
        })
}

fn status_strategy() -> impl Strategy<Value = DescriptorStatus> {
    (
        -1i32..4,
        prop::option::of((any::<u32>(), -1i32..8, "\\PC{0,6}")),
        any::<u32>(),
        prop::option::of((any::<i64>(), any::<i32>())),
        prop::option::of(quota_strategy()),
    )
        .prop_map(|(code, limit, remaining, reset, quota)| DescriptorStatus {
            code,
            current_limit: limit.map(|(requests_per_unit, unit, name)| RateLimit {
                name,
                requests_per_unit,
                unit,
            }),
            limit_remaining: remaining,
            duration_until_reset: reset.map(|(seconds, nanos)| Duration { seconds, nanos }),
            quota,
        })
}

fn header_strategy() -> impl Strategy<Value = HeaderValue> {
    (
        "\\PC{0,6}",
        "\\PC{0,6}",
        prop::collection::vec(any::<u8>(), 0..6),
    )
        .prop_map(|(key, value, raw_value)| HeaderValue {
            key,
            value,
            raw_value,
        })
}

fn response_strategy() -> impl Strategy<Value = RateLimitResponse> {
    (
        -1i32..4,
        prop::collection::vec(status_strategy(), 0..5),
        prop::collection::vec(header_strategy(), 0..3),
        prop::collection::vec(header_strategy(), 0..3),
        prop::collection::vec(any::<u8>(), 0..8),
        prop::option::of(prop::collection::hash_map(
            "\\PC{0,4}",
            value_strategy(),
            0..4,
        )),
        prop::option::of(quota_strategy()),
    )
        .prop_map(
            |(code, statuses, response, request, raw_body, metadata, quota)| RateLimitResponse {
                overall_code: code,
                statuses,
                response_headers_to_add: response,
                request_headers_to_add: request,
                raw_body,
                dynamic_metadata: metadata.map(|fields| Struct { fields }),
                quota,
            },
        )
}

fn encoded(r: &RateLimitResponse) -> Vec<u8> {
    let mut out = Vec::new();
    encode_response(r, &mut out);
    out
}

proptest! {
    /// A well-formed request, with unknown fields among its own (none a group), is read here
    /// and not handed to prost, and reads as prost reads it.
    #[test]
    fn reads_well_formed_requests_as_prost(
        req in request_strategy(),
        extra in prop::collection::vec((0u8..4, 4u32..2000, any::<prop::sample::Index>()), 0..4),
    ) {
        let mut bytes = req.encode_to_vec();
        for (kind, tag, at) in extra {
            // Unknown fields go between the message's own (a field's key is where prost's
            // encoding of one of them starts: splitting there keeps both whole).
            let at = field_starts(&bytes)[at.index(field_starts(&bytes).len())];
            let mut field = Vec::new();
            unknown(kind, tag, &mut field);
            bytes.splice(at..at, field);
        }
        let read = request(&bytes).expect("a well-formed request is read without prost");
        prop_assert_eq!(&read, &req);
        prop_assert_eq!(Ok(read), prost_decode(&bytes));
    }

    /// Fields repeated (last one wins, messages merge) and groups read as prost reads them.
    #[test]
    fn reads_repeated_fields_and_groups_as_prost(
        a in request_strategy(),
        b in request_strategy(),
        d in descriptor_strategy(),
        e in descriptor_strategy(),
        group in any::<bool>(),
    ) {
        // Two messages' bytes back to back are one message with both's fields.
        let mut bytes = a.encode_to_vec();
        bytes.extend(b.encode_to_vec());
        // A descriptor made of two: its overrides and hits_addend merge.
        let mut both = d.encode_to_vec();
        both.extend(e.encode_to_vec());
        key(2, 2, &mut bytes);
        prost::encoding::encode_varint(both.len() as u64, &mut bytes);
        bytes.extend(&both);
        if group {
            unknown(4, 9, &mut bytes);
        }
        prop_assert_eq!(ours(&bytes), prost_decode(&bytes));
        prop_assert_eq!(request(&bytes).is_ok(), !group);
    }

    /// Mutated and cut bytes: prost's message where prost reads one, prost's error (code and
    /// text) where it refuses, and the reader never takes what prost refuses.
    #[test]
    fn malformed_requests_get_prosts_error(
        req in request_strategy(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..3),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = req.encode_to_vec();
        for (at, x) in flips {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
        }
        let bytes = &bytes[..cut.index(bytes.len() + 1)];
        let theirs = prost_decode(bytes);
        if request(bytes).is_ok() {
            prop_assert!(theirs.is_ok(), "read what prost refuses: {:?}", theirs);
        }
        prop_assert_eq!(ours(bytes), theirs);
    }

    /// Any bytes at all: the same verdict as prost.
    #[test]
    fn arbitrary_bytes_get_prosts_verdict(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(ours(&bytes), prost_decode(&bytes));
    }

    /// A response, every field of it possible, is written as prost's bytes, which prost
    /// reads back as the response.
    #[test]
    fn writes_responses_as_prost(resp in response_strategy()) {
        let bytes = encoded(&resp);
        prop_assert_eq!(&bytes, &resp.encode_to_vec());
        prop_assert_eq!(RateLimitResponse::decode(&bytes[..]).unwrap(), resp);
    }
}

/// Where each top-level field of `bytes` (prost's encoding) starts, and its end.
fn field_starts(bytes: &[u8]) -> Vec<usize> {
    let mut r = Reader::new(bytes);
    let mut starts = vec![0];
    while r.more() {
        let (_, wire) = r.key().unwrap();
        r.skip(wire).unwrap();
        starts.push(r.at);
    }
    starts
}

#[test]
fn a_response_larger_than_the_stack_buffer_is_written_whole() {
    let resp = RateLimitResponse {
        overall_code: 2,
        statuses: (0..40)
            .map(|i| DescriptorStatus {
                code: 2,
                current_limit: Some(RateLimit {
                    name: format!("limit number {i}"),
                    requests_per_unit: 10 + i,
                    unit: 2,
                }),
                limit_remaining: i,
                duration_until_reset: Some(Duration {
                    seconds: i64::from(i),
                    nanos: -1,
                }),
                quota: None,
            })
            .collect(),
        ..Default::default()
    };
    let bytes = encoded(&resp);
    assert!(bytes.len() > 256, "{}", bytes.len());
    assert_eq!(bytes, resp.encode_to_vec());
}

#[test]
fn errors_are_prosts_word_for_word() {
    // A domain that is not UTF-8, a known field of the wrong wire type, a truncated entry.
    let mut bad_utf8 = Vec::new();
    key(1, 2, &mut bad_utf8);
    bad_utf8.extend_from_slice(&[2, 0xff, 0xfe]);
    let mut wrong_wire = Vec::new();
    key(3, 2, &mut wrong_wire);
    wrong_wire.extend_from_slice(&[1, b'x']);
    let mut truncated = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
    .encode_to_vec();
    truncated.pop();
    for bytes in [bad_utf8, wrong_wire, truncated] {
        assert!(request(&bytes).is_err());
        let (code, message) = ours(&bytes).unwrap_err();
        assert_eq!(code, tonic::Code::Internal);
        assert!(
            message.starts_with("failed to decode Protobuf message"),
            "{message}"
        );
        assert_eq!(Err((code, message)), prost_decode(&bytes));
    }
}
