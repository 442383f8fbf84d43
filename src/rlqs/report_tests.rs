//! Tests of [`check`]: each message is valid but for one problem, so each test fails without
//! the check it names.

use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

use super::*;

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
    assert_eq!(r.usages[0].bucket["tenant"], "acme");
    assert_eq!(r.usages[0].elapsed, Duration::from_secs(5));
    assert_eq!(
        r.usages[0].counts,
        Counts {
            allowed: 7,
            denied: 3
        }
    );
    assert_eq!(r.usages[0].counts.demand(), 10);
    assert_eq!(r.usages[1].bucket.len(), 2);
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
