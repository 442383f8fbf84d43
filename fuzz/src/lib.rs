//! The fuzz targets, as plain functions of the input bytes: the rules parser and compiler,
//! the descriptor matcher, the proto3 JSON request path through a local-mode limiter, and the
//! reading of the quota service's usage reports.
//!
//! Each target must return normally for every input; a panic is the bug a fuzzer reports.
//! The AFL binaries in `src/bin/` call them, and so does `tests/in_process/fuzz_regressions.rs` in the
//! main crate (which includes this file as a module), replaying `fuzz/regressions/` and
//! `fuzz/corpus/` and running proptests over them, so CI exercises every target without a
//! fuzzer. Only `sluice`, `std` and crates the main crate depends on itself (`prost`,
//! `envoy-types`) may be used here: the main crate's tests compile it too.
#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use prost::Message;
use sluice::core::clock::{ManualClock, UnixMillis};
use sluice::rlqs::{
    Report, ReportError, MAX_BUCKET_BYTES, MAX_TIME_ELAPSED, MAX_USAGES_PER_REPORT,
};
use sluice::rls::{HeaderNames, Options, RateLimiter};
use sluice::rules::{compile_sources, RuleSet, MAX_BUCKET_ENTRIES};

/// Inputs longer than this are ignored: the targets look for logic bugs, and a long input
/// only slows the fuzzer down. (Deeply nested YAML flow collections take time quadratic in
/// their depth to parse: ~15 s for 10,000 levels. Bounding that is the rules loader's job,
/// not this harness's; AFL reports such inputs as hangs, not crashes.)
pub const MAX_INPUT: usize = 64 * 1024;

/// Every target by name, as the fuzz binaries, `scripts/fuzz.sh` and the regression test
/// call them (`fuzz/corpus/<name>/`, `fuzz/regressions/<name>/`).
pub const TARGETS: [(&str, Target); 4] = [
    ("rules", rules),
    ("matcher", matcher),
    ("json", json),
    ("rlqs", rlqs),
];

/// A fuzz target: returns for every input, panics on a bug.
pub type Target = fn(&[u8]);

/// Rules for the matcher and the limiter: every kind of node the matcher knows (exact,
/// wildcard at the start, middle and end, key-only, whitelisted, nested), with and without
/// `share_threshold`, metrics options, shadow and quota modes, several limits, `replaces`.
pub const RULES: &str = r#"
domain: fuzz
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 3}
    additional_limits:
      - {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
  - key: a
    value: exact
    rate_limit: {unit: hour, requests_per_unit: 1, name: exact-a}
  - key: a
    value: allowed
  - key: w
    value: "pre*"
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: w
    value: "*post"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: w
    value: "mid*dle*"
    value_to_metric: true
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: fixed_window}
  - key: w
    value: "*"
    rate_limit: {unit: second, unit_multiplier: 7, requests_per_unit: 1}
  - key: n
    detailed_metric: true
    descriptors:
      - key: m
        value: "x*y"
        rate_limit: {unit: week, requests_per_unit: 100, replaces: [{name: exact-a}]}
        descriptors:
          - key: o
            quota_mode: true
            rate_limit: {unit: month, requests_per_unit: 0}
      - key: m
        rate_limit: {unit: year, requests_per_unit: 4294967295}
  - key: s
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: u
    rate_limit: {unlimited: true}
"#;

/// Target `rules`: rules files in, a rule set or errors out.
///
/// The input is one or more rules files separated by NUL bytes (invalid UTF-8 replaced);
/// a first line `#merge` (a YAML comment) loads them with domains merged across files.
/// Checks that compiling is deterministic and that a compiled set can be dumped and
/// queried along each rule's own path.
pub fn rules(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let merge = text.starts_with("#merge\n");
    let sources: Vec<(String, String)> = text
        .split('\0')
        .take(8)
        .enumerate()
        .map(|(i, t)| (format!("f{i}.yaml"), t.to_owned()))
        .collect();
    match compile_sources(&sources, merge) {
        Ok(set) => {
            let again = compile_sources(&sources, merge).expect("compiles the second time");
            assert_eq!(set.dump(), again.dump(), "compiling is not deterministic");
            for (i, rule) in set.rules().iter().enumerate() {
                assert!(
                    set.has_domain(&rule.domain),
                    "rule {i} has an unknown domain"
                );
                // A request naming each path component as key-only (`k`) or `k_v`: cheap to
                // build and reaches key-only and exact nodes alike. It need not match.
                let parts: Vec<&str> = rule.full_key.split('.').skip(1).collect();
                let entries: Vec<(&str, &str)> = parts
                    .iter()
                    .map(|p| p.split_once('_').unwrap_or((p, "")))
                    .collect();
                query(&set, &rule.domain, &entries);
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "a failed compile reports no error");
            for e in &errors {
                let _ = e.to_string();
            }
        }
    }
}

/// Target `matcher`: a descriptor against a compiled rule set.
///
/// The input is text lines (invalid UTF-8 replaced): the domain, then one entry per line as
/// `key=value` (no `=`: an empty value). The rules are [`RULES`] plus a second file with
/// domain `more`; an input with a line `%%` brings its own rules instead, the text before
/// that line (a set that does not compile ends the run).
pub fn matcher(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let own;
    let (set, request) = match text.split_once("\n%%\n") {
        Some((yaml, request)) => {
            match compile_sources(&[("own.yaml".into(), yaml.into())], false) {
                Ok(s) => own = s,
                Err(_) => return,
            }
            (&own, request)
        }
        None => (fixed_rules(), &*text),
    };
    let mut lines = request.split('\n');
    let domain = lines.next().unwrap_or_default();
    let entries: Vec<(&str, &str)> = lines
        .take(64)
        .map(|l| l.split_once('=').unwrap_or((l, "")))
        .collect();
    query(set, domain, &entries);
}

/// Target `json`: `POST /json`'s path, in process: proto3 JSON parsed, the request decided
/// by a local-mode limiter with [`RULES`] (response headers on), the answer printed back
/// as JSON. The limiter and its counters live for the whole run; the clock moves on by a
/// step the input chooses, so windows roll over.
pub fn json(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let Ok(req) = sluice::server::json::parse_request(data) else {
        return;
    };
    let (limiter, clock) = limiter();
    clock.advance_ms(u64::from(data.first().copied().unwrap_or(0)) * 997);
    if let Ok(resp) = limiter.should_rate_limit(&req) {
        assert_eq!(
            resp.statuses.len(),
            req.descriptors.len(),
            "one status per descriptor"
        );
        let _ = sluice::server::json::response_json(&resp).to_string();
    }
}

/// The stream domain the `rlqs` target reads later messages of a stream with.
pub const RLQS_STREAM: &str = "edge";

/// Target `rlqs`: a quota stream's message, `RateLimitQuotaUsageReports` as bytes off the
/// wire, read by `rlqs::check` as a stream's first message and as a later one of a stream
/// whose domain is [`RLQS_STREAM`].
///
/// `check` reads the wire format by hand, so prost's generated decoding of the same bytes is
/// the oracle: both refuse the same bytes as malformed; what `check` takes is prost's
/// message field for field (bucket ids sorted, a key sent twice keeping its last value), and
/// within every bound; and what it refuses breaks a rule of the protocol or a bound.
pub fn rlqs(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let decoded = RateLimitQuotaUsageReports::decode(data);
    for stream in [None, Some(RLQS_STREAM)] {
        let read = sluice::rlqs::check(data, stream, MAX_ID_BYTES);
        let m = match (&read, &decoded) {
            (Err(ReportError::Malformed(_)), Err(_)) => continue,
            (Err(ReportError::Malformed(e)), Ok(_)) => panic!("refused what prost reads: {e}"),
            (_, Err(e)) => panic!("took what prost refuses ({e}): {read:?}"),
            (_, Ok(m)) => m,
        };
        match read {
            Ok(report) => {
                assert!(valid(m, stream), "took an invalid report: {m:?}");
                same_report(&report, m, stream);
            }
            // Entries are counted as sent, a key sent twice twice; prost's map keeps one.
            Err(ReportError::TooManyEntries { count, .. }) => {
                assert!(
                    count > MAX_BUCKET_ENTRIES,
                    "{count} entries are not too many"
                )
            }
            Err(e) => {
                assert!(!valid(m, stream), "refused a valid report ({e}): {m:?}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

/// Whether `m`, a message of a stream whose domain is `stream`, keeps every rule `check`
/// documents: the domain, the bounds, and each usage's bucket id and `time_elapsed`.
fn valid(m: &RateLimitQuotaUsageReports, stream: Option<&str>) -> bool {
    let domain = match stream {
        None => !m.domain.is_empty(),
        Some(s) => m.domain.is_empty() || m.domain == s,
    };
    let bounded = |s: &String| !s.is_empty() && s.len() <= MAX_BUCKET_BYTES;
    domain
        && m.domain.len() <= MAX_BUCKET_BYTES
        && m.bucket_quota_usages.len() <= MAX_USAGES_PER_REPORT
        && m.bucket_quota_usages.iter().all(|u| {
            let (Some(id), Some(d)) = (&u.bucket_id, u.time_elapsed) else {
                return false;
            };
            (1..=MAX_BUCKET_ENTRIES).contains(&id.bucket.len())
                && id.bucket.iter().all(|(k, v)| bounded(k) && bounded(v))
                && id
                    .bucket
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
                    <= MAX_ID_BYTES
                && d.seconds >= 0
                && (0..1_000_000_000).contains(&d.nanos)
                && Duration::new(d.seconds as u64, d.nanos as u32) <= MAX_TIME_ELAPSED
        })
}

/// The bucket id bound the target checks reports against: `RLQS_MAX_BUCKET_ID_BYTES`'s
/// default.
const MAX_ID_BYTES: usize = 1024;

/// `report` holds `m`'s usages, in order.
fn same_report(report: &Report<'_>, m: &RateLimitQuotaUsageReports, stream: Option<&str>) {
    let domain = if m.domain.is_empty() {
        stream.unwrap_or_default()
    } else {
        &m.domain
    };
    assert_eq!(report.domain, domain, "the domain");
    assert_eq!(report.usages.len(), m.bucket_quota_usages.len(), "usages");
    for (u, pu) in report.usages.iter().zip(&m.bucket_quota_usages) {
        let mut want: Vec<(&str, &str)> = pu.bucket_id.as_ref().map_or(Vec::new(), |b| {
            b.bucket
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        });
        want.sort_unstable();
        assert_eq!(report.bucket(u), &want[..], "a bucket id");
        assert_eq!(
            (u.counts.allowed, u.counts.denied),
            (pu.num_requests_allowed, pu.num_requests_denied),
            "counts"
        );
        let d = pu.time_elapsed.unwrap_or_default();
        assert_eq!(
            u.elapsed,
            Duration::new(d.seconds as u64, d.nanos as u32),
            "time_elapsed"
        );
    }
}

/// Looks `entries` up twice in `set` and checks what a match claims.
fn query(set: &RuleSet, domain: &str, entries: &[(&str, &str)]) {
    let found = set.find(domain, entries);
    let again = set.find(domain, entries);
    assert_eq!(
        found.map(|m| (m.index, m.entity)),
        again.map(|m| (m.index, m.entity)),
        "matching is not deterministic"
    );
    if let Some(m) = found {
        assert!(!entries.is_empty(), "an empty descriptor matched");
        assert!(
            std::ptr::eq(m.rule, &set.rules()[m.index]),
            "the match's index is not its rule"
        );
        assert_eq!(m.rule.domain, domain, "matched a rule of another domain");
        if let Some(key) = set.metric_key(&m, entries) {
            assert!(
                key.starts_with(domain),
                "metric key {key:?} outside {domain:?}"
            );
        }
    }
}

fn fixed_rules() -> &'static RuleSet {
    static SET: OnceLock<RuleSet> = OnceLock::new();
    SET.get_or_init(|| {
        let more = "domain: more\ndescriptors:\n  - key: a\n    value: '*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        compile_sources(
            &[
                ("fuzz.yaml".into(), RULES.into()),
                ("more.yaml".into(), more.into()),
            ],
            false,
        )
        .expect("the fuzz rules compile")
    })
}

fn limiter() -> &'static (Arc<RateLimiter>, ManualClock) {
    static LIMITER: OnceLock<(Arc<RateLimiter>, ManualClock)> = OnceLock::new();
    LIMITER.get_or_init(|| {
        let clock = ManualClock::new(UnixMillis(1_700_006_400_000));
        let opts = Options {
            response_headers: Some(HeaderNames::default()),
            ..Options::default()
        };
        let limiter = RateLimiter::local(RULES, Arc::new(clock.clone()), opts)
            .expect("the fuzz rules compile");
        (limiter, clock)
    })
}
