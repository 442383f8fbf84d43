//! The IETF rate-limit fields of draft-ietf-httpapi-ratelimit-headers-11
//! (`LIMIT_RESPONSE_HEADERS_FORMAT=ietf`): `RateLimit-Policy` and `RateLimit` as RFC 9651
//! Structured Fields, and the RFC 9457 `quota-exceeded` problem body of a denial
//! (`LIMIT_RESPONSE_BODY=problem`). What each value means is in docs/wire.md,
//! "IETF headers and the problem body".

use std::borrow::Cow;
use std::fmt::Write as _;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;

use crate::core::gcra::{Geometry, NS_PER_MS};
use crate::core::{Algorithm, Verdict};
use crate::rules::LimitSpec;

/// The draft's problem type for a request over one or more quota policies (its section 5.1).
pub(super) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Most policy names a problem body lists: a request has up to `MAX_DESCRIPTORS` of them, and
/// a client needs the first few to know what to wait for, not a body as large as the rules.
pub(super) const MAX_VIOLATED_POLICIES: usize = 16;

const NS_PER_SEC: u64 = 1_000_000_000;

/// A limited descriptor as the fields describe it: the quota policy of its reported limit
/// and what is left of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Policy<'a> {
    /// The policy's name ([`name`] of its id): both fields and the problem body carry it.
    pub(super) name: Cow<'a, str>,
    /// `q`: the limit, or a token bucket's burst.
    pub(super) quota: u64,
    /// `w`: the window in seconds, or the time a bucket takes to refill its burst.
    pub(super) window: u64,
    /// `t`: seconds until the room left grows (see [`Policy::of`]).
    pub(super) grows: u64,
    /// A concurrency limit: `q` counts requests in flight (the draft's quota unit
    /// `concurrent-requests`), `w` is their lease.
    pub(super) concurrent: bool,
}

impl<'a> Policy<'a> {
    /// The policy of `spec` (the descriptor's reported limit), named `id`, after its verdict.
    ///
    /// `t` is the time until the room left grows: when over, until the request would be
    /// admitted (as `Retry-After`); a window within its limit, until it ends; a bucket within
    /// its limit, until its next token (0 when it is full, as nothing will come).
    pub(super) fn of(id: Cow<'a, str>, spec: &LimitSpec, verdict: &Verdict) -> Policy<'a> {
        let limit = &spec.limit;
        let secs = |ms: u64| ms.div_ceil(1000);
        let (quota, window, grows) = match limit.algorithm {
            Algorithm::TokenBucket { burst } => {
                let g = Geometry::of(limit);
                // The bucket is full again `reset_ms` from now, and holds one token more than
                // `remaining` once it owes `capacity - (remaining + 1)·T`.
                let next_ns = verdict
                    .reset_ms
                    .saturating_mul(NS_PER_MS)
                    .saturating_add(g.span(u64::from(verdict.remaining) + 1))
                    .saturating_sub(g.capacity_ns);
                let grows = if verdict.over {
                    secs(verdict.retry_ms)
                } else if verdict.reset_ms == 0 {
                    0
                } else {
                    next_ns.div_ceil(NS_PER_SEC)
                };
                let window = g.capacity_ns.div_ceil(NS_PER_SEC).max(1);
                (u64::from(burst), window, grows)
            }
            Algorithm::SlidingWindow | Algorithm::FixedWindow | Algorithm::Concurrency => {
                let grows = if verdict.over {
                    verdict.retry_ms
                } else {
                    verdict.reset_ms
                };
                let window = secs(limit.window_ms);
                (u64::from(limit.requests_per_unit), window, secs(grows))
            }
        };
        Policy {
            name: name(id),
            quota,
            window,
            grows,
            concurrent: limit.algorithm == Algorithm::Concurrency,
        }
    }
}

/// A policy id as a name the draft's fields can carry: an RFC 9651 String holds printable
/// ASCII only, so every other byte of the UTF-8 id, and `%` itself, is written `%xx` (lowercase
/// hex, as RFC 9651 Display Strings do). Ids of printable ASCII without `%` are kept as they are.
pub(super) fn name(id: Cow<'_, str>) -> Cow<'_, str> {
    let plain = |b: u8| (b' '..=b'~').contains(&b) && b != b'%';
    if id.bytes().all(plain) {
        return id;
    }
    let mut out = String::with_capacity(id.len() + 8);
    for b in id.bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// `name` as an RFC 9651 String (`"..."`, with `"` and `\` escaped), appended to `out`.
fn sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// `RateLimit-Policy` (one item per policy; two descriptors of one rule, the same policy
/// over two partitions, give one) and `RateLimit` (the policy `pick`, with `remaining` left).
pub(super) fn headers(
    policies: &[&Policy<'_>],
    pick: &Policy<'_>,
    remaining: u32,
) -> [HeaderValue; 2] {
    let mut list = String::new();
    let same = |a: &Policy<'_>, b: &Policy<'_>| {
        (&a.name, a.quota, a.window) == (&b.name, b.quota, b.window)
    };
    for (i, p) in policies.iter().enumerate() {
        if policies[..i].iter().any(|q| same(q, p)) {
            continue;
        }
        if !list.is_empty() {
            list.push_str(", ");
        }
        sf_string(&mut list, &p.name);
        let _ = write!(list, ";q={};w={}", p.quota, p.window);
        if p.concurrent {
            list.push_str(";qu=\"concurrent-requests\"");
        }
    }
    let mut limit = String::new();
    sf_string(&mut limit, &pick.name);
    let _ = write!(limit, ";r={remaining};t={}", pick.grows);
    [header("RateLimit-Policy", list), header("RateLimit", limit)]
}

/// A response header.
pub(super) fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value,
        ..Default::default()
    }
}

/// The RFC 9457 body of a denial: the draft's `quota-exceeded` type, its registered title,
/// status 429 (the draft's recommended code, and Envoy's default), and `violated-policies`:
/// the names given, each once, at most [`MAX_VIOLATED_POLICIES`].
pub(super) fn problem<'a>(violated: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let mut names: Vec<&str> = Vec::new();
    for n in violated {
        if names.len() == MAX_VIOLATED_POLICIES {
            break;
        }
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let body = serde_json::json!({
        "type": QUOTA_EXCEEDED,
        "title": "Quota Exceeded",
        "status": 429,
        "violated-policies": names,
    });
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Limit;
    use crate::rules::Unit;

    fn spec(requests_per_unit: u32, window_s: u64, algorithm: Algorithm) -> LimitSpec {
        LimitSpec {
            limit: Limit {
                requests_per_unit,
                window_ms: window_s * 1000,
                algorithm,
            },
            unit: Unit::Second,
            strict: true,
        }
    }

    fn verdict(remaining: u32, reset_ms: u64, retry_ms: u64) -> Verdict {
        Verdict {
            count_after: 0,
            over: retry_ms > 0,
            remaining,
            reset_ms,
            retry_ms,
        }
    }

    fn policy(name: &str, quota: u64, window: u64, grows: u64) -> Policy<'_> {
        Policy {
            name: name.into(),
            quota,
            window,
            grows,
            concurrent: false,
        }
    }

    #[test]
    fn names_keep_printable_ascii_and_percent_encode_the_rest() {
        assert!(matches!(
            name("edge.user".into()),
            Cow::Borrowed("edge.user")
        ));
        assert_eq!(name("a b\"c\\d".into()), "a b\"c\\d");
        // `%` itself, so that a name decodes to one id only.
        assert_eq!(name("50%".into()), "50%25");
        assert_eq!(name("café\t☃".into()), "caf%c3%a9%09%e2%98%83");
        assert_eq!(name("\u{7f}~".into()), "%7f~");
    }

    #[test]
    fn fields_are_rfc_9651_lists_of_strings_with_quotes_and_backslashes_escaped() {
        let odd = policy(r#"say "hi" \o/"#, 5, 60, 7);
        let plain = policy("edge.user", 100, 3600, 12);
        let other_user = policy("edge.user", 100, 3600, 20);
        let [p, r] = headers(&[&plain, &odd, &other_user], &odd, 3);
        assert_eq!(p.key, "RateLimit-Policy");
        assert_eq!(
            p.value,
            r#""edge.user";q=100;w=3600, "say \"hi\" \\o/";q=5;w=60"#
        );
        assert_eq!(r.key, "RateLimit");
        assert_eq!(r.value, r#""say \"hi\" \\o/";r=3;t=7"#);
        // A non-ASCII id reaches the field percent-encoded: printable ASCII only.
        let snow = Policy::of(
            "☃".into(),
            &spec(1, 1, Algorithm::FixedWindow),
            &verdict(0, 1, 0),
        );
        let [p, _] = headers(&[&snow], &snow, 0);
        assert_eq!(p.value, r#""%e2%98%83";q=1;w=1"#);
        assert!(p.value.bytes().all(|b| (b' '..=b'~').contains(&b)));
    }

    #[test]
    fn a_window_is_its_limit_per_its_length_and_grows_when_it_ends() {
        let s = spec(100, 90, Algorithm::SlidingWindow);
        assert_eq!(
            Policy::of("p".into(), &s, &verdict(40, 12_300, 0)),
            policy("p", 100, 90, 13)
        );
        // Over: when the request would be admitted.
        assert_eq!(
            Policy::of("p".into(), &s, &verdict(0, 12_300, 2_001)),
            policy("p", 100, 90, 3)
        );
    }

    #[test]
    fn a_concurrency_limit_is_its_places_in_flight_per_their_lease() {
        let s = spec(4, 30, Algorithm::Concurrency);
        let p = Policy::of("c".into(), &s, &verdict(1, 9_500, 0));
        assert_eq!(
            p,
            Policy {
                concurrent: true,
                ..policy("c", 4, 30, 10)
            }
        );
        let [field, _] = headers(&[&p], &p, 1);
        assert_eq!(field.value, r#""c";q=4;w=30;qu="concurrent-requests""#);
    }

    #[test]
    fn a_bucket_is_its_burst_per_its_refill_and_grows_at_its_next_token() {
        // 10 a second, bursts of 30: 30 tokens refill in 3 s, a token every 100 ms.
        let s = spec(10, 1, Algorithm::TokenBucket { burst: 30 });
        // 25 left, full in 450 ms: the 26th comes in 50 ms (owed 450 = 4.5 tokens).
        assert_eq!(
            Policy::of("b".into(), &s, &verdict(25, 450, 0)),
            policy("b", 30, 3, 1)
        );
        // 10 an hour, bursts of 5: a token every 6 minutes, the burst in 30. 2 left, full in
        // 17 min (owed 2.83 tokens): the third comes in 5 min.
        let slow = spec(10, 3600, Algorithm::TokenBucket { burst: 5 });
        assert_eq!(
            Policy::of("s".into(), &slow, &verdict(2, 1_020_000, 0)),
            policy("s", 5, 1800, 300)
        );
        // Full: nothing will come.
        assert_eq!(Policy::of("s".into(), &slow, &verdict(5, 0, 0)).grows, 0);
        // Over: as Retry-After.
        assert_eq!(
            Policy::of("s".into(), &slow, &verdict(0, 2_000_000, 360_000)).grows,
            360
        );
    }

    #[test]
    fn the_problem_body_names_each_violated_policy_once_up_to_the_bound() {
        let body = problem(["a", "b", "a"]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
                "title": "Quota Exceeded",
                "status": 429,
                "violated-policies": ["a", "b"],
            })
        );
        let many: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
        let body = problem(many.iter().map(String::as_str));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let listed = v["violated-policies"].as_array().unwrap();
        assert_eq!(listed.len(), MAX_VIOLATED_POLICIES);
        assert_eq!(listed[15], "p15");
    }
}
