//! Tests of [`check`]: each message is valid but for one problem, so each test fails without
//! the check it names; and the reading of the wire format, held to prost's decoding of the
//! same bytes.

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use prost::Message;

use super::*;

/// `RLQS_MAX_BUCKET_ID_BYTES`'s default.
const ID_BYTES: usize = 1024;

/// [`super::check`] of `m`'s bytes (kept for the test's life: the report borrows them).
fn check(
    m: &RateLimitQuotaUsageReports,
    stream: Option<&'static str>,
) -> Result<Report<'static>, ReportError> {
    super::check(m.encode_to_vec().leak(), stream, ID_BYTES)
}

fn bucket(entries: &[(&str, &str)]) -> Option<BucketId> {
    Some(BucketId {
        bucket: entries
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    })
}

fn secs(seconds: i64, nanos: i32) -> Option<PbDuration> {
    Some(PbDuration { seconds, nanos })
}

/// A valid usage: `{tenant: acme}`, 5 s, 7 allowed and 3 denied.
fn usage() -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: bucket(&[("tenant", "acme")]),
        time_elapsed: secs(5, 0),
        num_requests_allowed: 7,
        num_requests_denied: 3,
    }
}

fn message(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: usages,
    }
}

/// The error of a first message holding a valid usage and then `u`.
fn error_of(u: BucketQuotaUsage) -> ReportError {
    check(&message(vec![usage(), u]), None).unwrap_err()
}

#[test]
fn a_valid_report_is_typed_usage_in_order() {
    let m = message(vec![
        usage(),
        BucketQuotaUsage {
            bucket_id: bucket(&[("tenant", "beta"), ("method", "GET")]),
            time_elapsed: secs(1, 500_000_000),
            ..usage()
        },
    ]);
    let r = check(&m, None).unwrap();
    assert_eq!(r.domain, "edge");
    assert_eq!(r.usages.len(), 2);
    assert_eq!(r.bucket(&r.usages[0]), [("tenant", "acme")]);
    assert_eq!(r.usages[0].elapsed, Duration::from_secs(5));
    assert_eq!(
        r.usages[0].counts,
        Counts {
            allowed: 7,
            denied: 3
        }
    );
    assert_eq!(r.usages[0].counts.demand(), 10);
    // Sorted by key.
    assert_eq!(
        r.bucket(&r.usages[1]),
        [("method", "GET"), ("tenant", "beta")]
    );
    assert_eq!(r.usages[1].elapsed, Duration::from_millis(1500));
    // No usages at all: nothing to do, but nothing wrong.
    assert!(check(&message(vec![]), None).unwrap().usages.is_empty());
}

#[test]
fn the_first_report_names_the_domain_later_ones_may_not_change_it() {
    let mut m = message(vec![usage()]);
    m.domain.clear();
    assert_eq!(check(&m, None).unwrap_err(), ReportError::NoDomain);
    assert_eq!(
        check(&m, None).unwrap_err().to_string(),
        "the stream's first report must name a domain"
    );
    assert_eq!(check(&m, Some("edge")).unwrap().domain, "edge");
    m.domain = "edge".into();
    assert_eq!(check(&m, Some("edge")).unwrap().domain, "edge");
    m.domain = "other".into();
    let e = check(&m, Some("edge")).unwrap_err();
    assert!(matches!(e, ReportError::DomainChanged { .. }), "{e}");
    m.domain = "d".repeat(MAX_BUCKET_BYTES + 1);
    assert_eq!(
        check(&m, None).unwrap_err(),
        ReportError::DomainTooLong {
            len: MAX_BUCKET_BYTES + 1
        }
    );
}

#[test]
fn a_usage_needs_a_bucket_id_with_entries() {
    let e = error_of(BucketQuotaUsage {
        bucket_id: None,
        ..usage()
    });
    assert_eq!(e, ReportError::NoBucketId { index: 1 });
    assert_eq!(e.to_string(), "bucket usage 1: no bucket_id");
    let e = error_of(BucketQuotaUsage {
        bucket_id: bucket(&[]),
        ..usage()
    });
    assert_eq!(e, ReportError::EmptyBucket { index: 1 });
    assert_eq!(
        e.to_string(),
        "bucket usage 1: the bucket_id is an empty map"
    );
}

#[test]
fn keys_and_values_are_not_empty() {
    let e = error_of(BucketQuotaUsage {
        bucket_id: bucket(&[("tenant", "acme"), ("", "x")]),
        ..usage()
    });
    assert_eq!(e, ReportError::EmptyKey { index: 1 });
    // The first empty value's key, bytewise, whatever the map's order.
    let e = error_of(BucketQuotaUsage {
        bucket_id: bucket(&[("tenant", ""), ("method", ""), ("path", "/")]),
        ..usage()
    });
    assert_eq!(
        e.to_string(),
        "bucket usage 1: the bucket_id's \"method\" has an empty value"
    );
}

#[test]
fn bucket_ids_are_bounded() {
    let keys: Vec<String> = (0..=MAX_BUCKET_ENTRIES).map(|i| format!("k{i}")).collect();
    let entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    assert!(check(
        &message(vec![BucketQuotaUsage {
            bucket_id: bucket(&entries[..MAX_BUCKET_ENTRIES]),
            ..usage()
        }]),
        None
    )
    .is_ok());
    let e = error_of(BucketQuotaUsage {
        bucket_id: bucket(&entries),
        ..usage()
    });
    assert_eq!(
        e,
        ReportError::TooManyEntries {
            index: 1,
            count: MAX_BUCKET_ENTRIES + 1
        }
    );
    let long = "x".repeat(MAX_BUCKET_BYTES + 1);
    for entry in [(long.as_str(), "v"), ("k", long.as_str())] {
        let e = error_of(BucketQuotaUsage {
            bucket_id: bucket(&[entry]),
            ..usage()
        });
        assert_eq!(
            e,
            ReportError::EntryTooLong {
                index: 1,
                len: MAX_BUCKET_BYTES + 1
            }
        );
    }
}

#[test]
fn a_bucket_ids_keys_and_values_are_bounded_together() {
    // Four entries of 256 bytes (key and value): the bound exactly, then a byte over it.
    let keys: Vec<String> = (0..4).map(|i| format!("{i}{}", "k".repeat(127))).collect();
    let value = "v".repeat(128);
    let mut entries: Vec<(&str, &str)> =
        keys.iter().map(|k| (k.as_str(), value.as_str())).collect();
    let fits = BucketQuotaUsage {
        bucket_id: bucket(&entries),
        ..usage()
    };
    assert!(check(&message(vec![fits]), None).is_ok());
    let longer = format!("{value}v");
    entries[3].1 = &longer;
    let e = error_of(BucketQuotaUsage {
        bucket_id: bucket(&entries),
        ..usage()
    });
    assert_eq!(
        e,
        ReportError::IdTooLong {
            index: 1,
            len: ID_BYTES + 1,
            max: ID_BYTES
        }
    );
    assert_eq!(
        e.to_string(),
        "bucket usage 1: the bucket_id's keys and values are 1025 bytes, more than \
         RLQS_MAX_BUCKET_ID_BYTES (1024)"
    );
}

#[test]
fn a_report_has_a_bounded_number_of_usages() {
    let m = message(vec![usage(); MAX_USAGES_PER_REPORT]);
    assert_eq!(check(&m, None).unwrap().usages.len(), MAX_USAGES_PER_REPORT);
    let m = message(vec![usage(); MAX_USAGES_PER_REPORT + 1]);
    assert_eq!(
        check(&m, None).unwrap_err(),
        ReportError::TooManyUsages {
            count: MAX_USAGES_PER_REPORT + 1
        }
    );
}

#[test]
fn time_elapsed_is_required_but_zero_is_a_first_report() {
    let e = error_of(BucketQuotaUsage {
        time_elapsed: None,
        ..usage()
    });
    assert_eq!(e, ReportError::NoTimeElapsed { index: 1 });
    assert_eq!(e.to_string(), "bucket usage 1: no time_elapsed");
    let m = message(vec![BucketQuotaUsage {
        time_elapsed: secs(0, 0),
        num_requests_allowed: 1,
        num_requests_denied: 0,
        ..usage()
    }]);
    assert_eq!(check(&m, None).unwrap().usages[0].elapsed, Duration::ZERO);
}

#[test]
fn time_elapsed_is_a_sane_duration() {
    for (seconds, nanos) in [
        (-5, 0),
        (0, -1),
        (-1, -500),
        (1, 1_000_000_000),
        (i64::MIN, 0),
    ] {
        let e = error_of(BucketQuotaUsage {
            time_elapsed: secs(seconds, nanos),
            ..usage()
        });
        assert_eq!(
            e,
            ReportError::BadTimeElapsed {
                index: 1,
                seconds,
                nanos
            }
        );
    }
    let max = MAX_TIME_ELAPSED.as_secs() as i64;
    let m = message(vec![BucketQuotaUsage {
        time_elapsed: secs(max, 0),
        ..usage()
    }]);
    assert_eq!(check(&m, None).unwrap().usages[0].elapsed, MAX_TIME_ELAPSED);
    for (seconds, nanos) in [(max, 1), (i64::MAX, 999_999_999)] {
        let e = error_of(BucketQuotaUsage {
            time_elapsed: secs(seconds, nanos),
            ..usage()
        });
        assert_eq!(e, ReportError::TimeElapsedTooLong { index: 1, seconds });
    }
}

#[test]
fn counts_near_two_to_the_64_saturate() {
    let m = message(vec![BucketQuotaUsage {
        num_requests_allowed: u64::MAX - 1,
        num_requests_denied: 5,
        ..usage()
    }]);
    let counts = check(&m, None).unwrap().usages[0].counts;
    assert_eq!(counts.allowed, u64::MAX - 1);
    assert_eq!(counts.demand(), u64::MAX);
    let sum = counts.saturating_add(counts);
    assert_eq!(
        sum,
        Counts {
            allowed: u64::MAX,
            denied: 10
        }
    );
    assert_eq!(
        Counts::default().saturating_add(Counts {
            allowed: 1,
            denied: 2
        }),
        Counts {
            allowed: 1,
            denied: 2
        }
    );
}

#[test]
fn the_first_problem_in_order_is_reported() {
    let m = message(vec![
        usage(),
        BucketQuotaUsage {
            time_elapsed: None,
            ..usage()
        },
        BucketQuotaUsage {
            bucket_id: None,
            ..usage()
        },
    ]);
    assert_eq!(
        check(&m, None).unwrap_err(),
        ReportError::NoTimeElapsed { index: 1 }
    );
    let mut m = m;
    m.domain.clear();
    assert_eq!(check(&m, None).unwrap_err(), ReportError::NoDomain);
}

#[test]
fn the_wire_format_is_read_as_protobuf_defines_it() {
    use prost::encoding::{encode_key, encode_varint, WireType};
    // A field of `m` written by hand: `tag`, then `body` length-delimited.
    fn field(out: &mut Vec<u8>, tag: u32, body: &[u8]) {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }
    let entry = |k: &str, v: &str| {
        let mut e = Vec::new();
        field(&mut e, 1, k.as_bytes());
        field(&mut e, 2, v.as_bytes());
        e
    };
    let id = |entries: &[Vec<u8>]| {
        let mut b = Vec::new();
        for e in entries {
            field(&mut b, 1, e);
        }
        b
    };
    let mut u = Vec::new();
    // A key sent twice keeps its last value; a second bucket_id adds its entries; a second
    // time_elapsed overrides the fields it carries (its zero seconds are not on the wire);
    // an unknown field is skipped.
    field(
        &mut u,
        1,
        &id(&[entry("tenant", "acme"), entry("method", "GET")]),
    );
    field(&mut u, 1, &id(&[entry("tenant", "beta")]));
    field(
        &mut u,
        2,
        &PbDuration {
            seconds: 5,
            nanos: 7,
        }
        .encode_to_vec(),
    );
    field(
        &mut u,
        2,
        &PbDuration {
            seconds: 0,
            nanos: 9,
        }
        .encode_to_vec(),
    );
    encode_key(3, WireType::Varint, &mut u);
    encode_varint(4, &mut u);
    field(&mut u, 99, b"ignored");
    let mut msg = Vec::new();
    field(&mut msg, 1, b"edge");
    field(&mut msg, 2, &u);
    let r = super::check(&msg, None, ID_BYTES).unwrap();
    let usage = &r.usages[0];
    assert_eq!(r.bucket(usage), [("method", "GET"), ("tenant", "beta")]);
    assert_eq!(usage.elapsed, Duration::new(5, 9));
    assert_eq!(usage.counts.allowed, 4);
    // prost reads the same bytes the same way.
    let p = RateLimitQuotaUsageReports::decode(&msg[..]).unwrap();
    let pu = &p.bucket_quota_usages[0];
    assert_eq!(pu.bucket_id.as_ref().unwrap().bucket["tenant"], "beta");
    assert_eq!(pu.time_elapsed, secs(5, 9));

    // Malformed: truncated, a known field of the wrong wire type, a string not UTF-8.
    let e = super::check(&msg[..msg.len() - 1], None, ID_BYTES).unwrap_err();
    assert!(matches!(e, ReportError::Malformed(_)), "{e}");
    let mut wrong = Vec::new();
    encode_key(1, WireType::Varint, &mut wrong);
    encode_varint(1, &mut wrong);
    let e = super::check(&wrong, None, ID_BYTES).unwrap_err();
    assert!(
        e.to_string().starts_with("the report is not a valid"),
        "{e}"
    );
    let (mut count_as_bytes, mut wrong) = (Vec::new(), Vec::new());
    field(&mut count_as_bytes, 3, b"4");
    field(&mut wrong, 2, &count_as_bytes);
    let e = super::check(&wrong, None, ID_BYTES).unwrap_err();
    assert!(matches!(e, ReportError::Malformed(_)), "{e}");
    let mut bad = Vec::new();
    field(&mut bad, 1, &[0xff, 0xfe]);
    let e = super::check(&bad, None, ID_BYTES).unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
}

proptest::proptest! {
    /// What prost's generated decoding reads from a message's bytes (mutated or not), this
    /// reads the same: the same fields when it takes the message, and refused as malformed
    /// exactly when prost refuses it.
    #[test]
    fn reads_what_prost_reads(
        domain in "[a-c]{0,3}",
        usages in proptest::collection::vec(
            (
                proptest::option::of(proptest::collection::hash_map("[a-c]{0,2}", "[x-z]{0,2}", 0..4)),
                proptest::option::of((-2i64..4000, -2i32..1_000_000_002)),
                proptest::prelude::any::<u64>(),
                0u64..3,
            ),
            0..4,
        ),
        cut in proptest::prelude::any::<proptest::sample::Index>(),
        flip in proptest::option::of((proptest::prelude::any::<proptest::sample::Index>(), 1u8..=255)),
    ) {
        let m = RateLimitQuotaUsageReports {
            domain,
            bucket_quota_usages: usages
                .into_iter()
                .map(|(bucket, elapsed, allowed, denied)| BucketQuotaUsage {
                    bucket_id: bucket.map(|bucket| BucketId { bucket }),
                    time_elapsed: elapsed.map(|(seconds, nanos)| PbDuration { seconds, nanos }),
                    num_requests_allowed: allowed,
                    num_requests_denied: denied,
                })
                .collect(),
        };
        let whole = m.encode_to_vec();
        if let Ok(r) = super::check(&whole, None, ID_BYTES) {
            let p = &m.bucket_quota_usages;
            proptest::prop_assert_eq!(r.domain, m.domain.as_str());
            proptest::prop_assert_eq!(r.usages.len(), p.len());
            for (u, pu) in r.usages.iter().zip(p) {
                let mut want: Vec<(&str, &str)> = pu.bucket_id.as_ref().unwrap().bucket
                    .iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                want.sort_unstable();
                proptest::prop_assert_eq!(r.bucket(u), &want[..]);
                proptest::prop_assert_eq!(u.counts.allowed, pu.num_requests_allowed);
                proptest::prop_assert_eq!(u.counts.denied, pu.num_requests_denied);
                let d = pu.time_elapsed.unwrap();
                proptest::prop_assert_eq!(u.elapsed, Duration::new(d.seconds as u64, d.nanos as u32));
            }
        }
        let mut bytes = whole;
        if let Some((at, x)) = flip {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
        }
        let bytes = &bytes[..cut.index(bytes.len() + 1)];
        let ours = matches!(super::check(bytes, None, ID_BYTES), Err(ReportError::Malformed(_)));
        let theirs = RateLimitQuotaUsageReports::decode(bytes).is_err();
        proptest::prop_assert_eq!(ours, theirs, "{:?}", bytes);
    }
}
