//! Step 4 of a request: statuses in request order, the overall code (quota and shadow modes,
//! with the quota groups of `metadata.rs`), the rate-limit response headers (the reference's,
//! or the IETF draft's of `ietf.rs`), a denial's problem body, and the dynamic metadata
//! (`metadata.rs`, with the rules behind the decision from `denied.rs`).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::borrow::Cow;

use super::denied::{self, Denials};
use super::ietf::{self, header, Policy};
use super::metadata::{dynamic_metadata, QuotaGroups};
use super::resolve::Target;
use super::{HeaderFormat, HeaderNames, Options};
use crate::core::decide::Outcome;
use crate::rules::Rule;

/// Statuses gathered in request order, with what the overall code and the headers need.
#[derive(Default)]
pub(super) struct Response<'a> {
    statuses: Vec<DescriptorStatus>,
    /// Per status, when the response headers are on: seconds until a refused request would
    /// be admitted (`Retry-After`). Not allocated otherwise: every request would pay for it.
    retry_secs: Option<Vec<u64>>,
    /// Per status, when the IETF headers or the problem body are on: a limited descriptor's
    /// policy.
    policies: Option<Vec<Option<Policy<'a>>>>,
    non_quota_over: bool,
    /// The descriptors whose rule is in shadow mode and over: reported OK, but they would
    /// have denied the request (`denied.rs`).
    shadow_over: Vec<usize>,
}

impl<'a> Response<'a> {
    /// A response for `n` descriptors.
    pub(super) fn with_capacity(n: usize, opts: &Options) -> Self {
        Response {
            statuses: Vec::with_capacity(n),
            retry_secs: opts
                .response_headers
                .is_some()
                .then(|| Vec::with_capacity(n)),
            policies: opts.wants_policies().then(|| Vec::with_capacity(n)),
            ..Default::default()
        }
    }

    /// A descriptor no rule applies to: OK, no limit, 0 left.
    pub(super) fn no_rule(&mut self) {
        self.push(
            DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            },
            0,
            None,
        );
    }

    /// An unlimited descriptor: OK, no limit, `u32::MAX` left.
    pub(super) fn unlimited(&mut self) {
        self.push(
            DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..Default::default()
            },
            0,
            None,
        );
    }

    /// A limited descriptor's status. Rule `shadow_mode` reports over as OK. `policy` names
    /// its policy in the IETF fields ([`Target::policy_id`]); asked for only when they are on.
    pub(super) fn limited(
        &mut self,
        rule: &Rule,
        outcome: &Outcome,
        opts: &Options,
        policy: impl FnOnce() -> Cow<'a, str>,
    ) {
        let reported_over = outcome.over && !rule.shadow_mode;
        if outcome.over && rule.shadow_mode {
            self.shadow_over.push(self.statuses.len());
        }
        // Quota descriptors count by their groups, in `finish`.
        if !(rule.quota_mode || opts.quota_mode) {
            self.non_quota_over |= reported_over;
        }
        let spec = &rule.limits[outcome.reported];
        let policy = self
            .policies
            .is_some()
            .then(|| Policy::of(policy(), spec, &outcome.verdict));
        self.push(
            DescriptorStatus {
                code: if reported_over {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                current_limit: Some(PbRateLimit {
                    name: rule.name.clone(),
                    requests_per_unit: spec.limit.requests_per_unit,
                    unit: super::unit::to_pb(spec.unit) as i32,
                }),
                limit_remaining: outcome.verdict.remaining,
                duration_until_reset: Some(PbDuration {
                    seconds: outcome.verdict.reset_ms.div_ceil(1000) as i64,
                    nanos: 0,
                }),
                quota: None,
            },
            outcome.verdict.retry_ms.div_ceil(1000),
            policy,
        );
    }

    fn push(&mut self, status: DescriptorStatus, retry_secs: u64, policy: Option<Policy<'a>>) {
        self.statuses.push(status);
        if let Some(r) = &mut self.retry_secs {
            r.push(retry_secs);
        }
        if let Some(p) = &mut self.policies {
            p.push(policy);
        }
    }

    /// The response to `req`, whose descriptors resolved to `targets`: OVER_LIMIT iff a
    /// non-quota descriptor is over or every quota group is (there is one: [`QuotaGroups`]),
    /// unless global shadow mode says OK. A refused one carries the problem body when it is
    /// on; the dynamic metadata, when it is on.
    pub(super) fn finish(
        self,
        req: &RateLimitRequest,
        targets: &[Target<'_>],
        opts: &Options,
    ) -> RateLimitResponse {
        let groups = QuotaGroups::of(req, targets, &self.statuses, opts);
        let over = self.non_quota_over || groups.all_over();
        let refused = over && !opts.shadow_mode;
        let policies = self.policies.as_deref().unwrap_or_default();
        let mut response_headers_to_add = match &opts.response_headers {
            Some(names) => headers(
                names,
                opts.header_format,
                &self.statuses,
                policies,
                self.retry_secs.as_deref().unwrap_or_default(),
                refused,
            ),
            None => Vec::new(),
        };
        let mut raw_body = Vec::new();
        if refused && opts.problem_body {
            let violated = self
                .statuses
                .iter()
                .zip(policies)
                .filter(|(s, _)| s.code == Code::OverLimit as i32)
                .filter_map(|(_, p)| p.as_ref().map(|p| p.name.as_ref()));
            raw_body = ietf::problem(violated);
            response_headers_to_add.push(header("content-type", "application/problem+json".into()));
        }
        let mut dynamic_metadata = opts
            .dynamic_metadata
            .then(|| dynamic_metadata(req, targets, &self.statuses, &groups));
        if opts.rule_metadata {
            let denials = Denials {
                statuses: &self.statuses,
                shadow_over: &self.shadow_over,
                refused,
                // Global shadow mode turned an over request into OK: its rules would have
                // denied it.
                shadowed: over && opts.shadow_mode,
            };
            if let Some(rules) = denials.metadata(targets) {
                // Beside the reference's fields when RESPONSE_DYNAMIC_METADATA is on too: they
                // have no `sluice` field to collide with.
                dynamic_metadata
                    .get_or_insert_with(Default::default)
                    .fields
                    .insert(denied::FIELD.to_string(), rules);
            }
        }
        RateLimitResponse {
            overall_code: if refused { Code::OverLimit } else { Code::Ok } as i32,
            statuses: self.statuses,
            response_headers_to_add,
            raw_body,
            dynamic_metadata,
            ..Default::default()
        }
    }
}

/// The most restrictive limited descriptor: an over-limit one wins, else the one with the
/// fewest hits left, then the one that resets last.
fn most_restrictive(statuses: &[DescriptorStatus]) -> Option<usize> {
    statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| s.current_limit.is_some())
        .max_by_key(|(_, s)| {
            (
                s.code == Code::OverLimit as i32,
                std::cmp::Reverse(s.limit_remaining),
                reset(s),
            )
        })
        .map(|(i, _)| i)
}

fn reset(s: &DescriptorStatus) -> i64 {
    s.duration_until_reset.as_ref().map_or(0, |d| d.seconds)
}

/// The rate-limit headers from the most restrictive limited descriptor, in `format`: the
/// reference's three (named by `names`), or the IETF draft's `RateLimit-Policy` (every limited
/// descriptor's policy) and `RateLimit`. `Retry-After` is added when the request is refused:
/// when the picked descriptor would admit it again (its window's end, or the time its bucket
/// takes to hold the tokens).
fn headers(
    names: &HeaderNames,
    format: HeaderFormat,
    statuses: &[DescriptorStatus],
    policies: &[Option<Policy<'_>>],
    retry_secs: &[u64],
    refused: bool,
) -> Vec<HeaderValue> {
    let Some(i) = most_restrictive(statuses) else {
        return Vec::new();
    };
    let pick = &statuses[i];
    let mut out = match format {
        HeaderFormat::Reference => {
            let limit = pick
                .current_limit
                .as_ref()
                .map_or(0, |l| l.requests_per_unit);
            vec![
                header(&names.limit, limit.to_string()),
                header(&names.remaining, pick.limit_remaining.to_string()),
                header(&names.reset, reset(pick).to_string()),
            ]
        }
        HeaderFormat::Ietf => {
            // Every limited descriptor has its policy in this format.
            let Some(policy) = policies.get(i).and_then(Option::as_ref) else {
                return Vec::new();
            };
            let all: Vec<&Policy<'_>> = policies.iter().flatten().collect();
            ietf::headers(&all, policy, pick.limit_remaining).to_vec()
        }
    };
    if refused {
        // A refused request whose picked descriptor is within its limit (quota mode, say)
        // is told the reset, as before.
        let retry = retry_secs.get(i).copied().filter(|&r| r > 0);
        out.push(header(
            "Retry-After",
            retry.unwrap_or(reset(pick) as u64).to_string(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

    use super::*;
    use crate::core::clock::{ManualClock, UnixMillis};
    use crate::rls::RateLimiter;

    /// The start of an hour.
    const T0: UnixMillis = UnixMillis(1_700_006_400_000);

    const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 10}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
"#;

    fn ietf() -> Options {
        Options {
            response_headers: Some(HeaderNames::default()),
            header_format: HeaderFormat::Ietf,
            problem_body: true,
            ..Options::default()
        }
    }

    fn ask(l: &RateLimiter, descriptors: &[(&str, &str)]) -> RateLimitResponse {
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors: descriptors
                .iter()
                .map(|(k, v)| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: k.to_string(),
                        value: v.to_string(),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        l.should_rate_limit(&req).unwrap()
    }

    fn header<'r>(r: &'r RateLimitResponse, key: &str) -> Option<&'r str> {
        let mut found = r.response_headers_to_add.iter().filter(|h| h.key == key);
        let first = found.next().map(|h| h.value.as_str());
        assert!(found.next().is_none(), "{key} twice");
        first
    }

    #[test]
    fn the_ietf_fields_name_every_policy_and_report_the_most_restrictive() {
        let l = RateLimiter::local(RULES, Arc::new(ManualClock::new(T0)), ietf()).unwrap();
        // Fewest left wins: the path's 2 of 3 over the user's 9 of 10. Descriptors without a
        // limit have no policy.
        let r = ask(
            &l,
            &[("user", "a"), ("path", "/x"), ("free", "f"), ("nope", "n")],
        );
        assert_eq!(
            header(&r, "RateLimit-Policy"),
            Some(r#""per-user";q=10;w=60, "d.path";q=3;w=3600"#)
        );
        assert_eq!(header(&r, "RateLimit"), Some(r#""d.path";r=2;t=3600"#));
        assert_eq!(header(&r, "Retry-After"), None);
        assert_eq!(header(&r, "content-type"), None);
        assert!(r.raw_body.is_empty());
        // An over-limit descriptor wins over one with nothing left but within its limit.
        ask(&l, &[("path", "/x")]);
        ask(&l, &[("tight", "t")]);
        let r = ask(&l, &[("path", "/x"), ("tight", "t")]);
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        let retry = header(&r, "Retry-After").expect("Retry-After when refused");
        assert_eq!(
            header(&r, "RateLimit"),
            Some(format!(r#""d.tight";r=0;t={retry}"#).as_str())
        );
        assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
        let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
        assert_eq!(body["violated-policies"], serde_json::json!(["d.tight"]));
        assert_eq!(body["status"], 429);
    }

    #[test]
    fn a_request_not_refused_has_no_problem_body() {
        // Global shadow mode: the request passes, so nothing is violated for the client.
        let opts = Options {
            shadow_mode: true,
            ..ietf()
        };
        let l = RateLimiter::local(RULES, Arc::new(ManualClock::new(T0)), opts).unwrap();
        ask(&l, &[("tight", "t")]);
        let r = ask(&l, &[("tight", "t")]);
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.raw_body.is_empty());
        assert_eq!(header(&r, "content-type"), None);
        assert_eq!(header(&r, "Retry-After"), None);
        // The reference's headers and the problem body go together.
        let opts = Options {
            header_format: HeaderFormat::Reference,
            ..ietf()
        };
        let l = RateLimiter::local(RULES, Arc::new(ManualClock::new(T0)), opts).unwrap();
        ask(&l, &[("tight", "t")]);
        let r = ask(&l, &[("tight", "t")]);
        let keys: Vec<&str> = r
            .response_headers_to_add
            .iter()
            .map(|h| h.key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "RateLimit-Limit",
                "RateLimit-Remaining",
                "RateLimit-Reset",
                "Retry-After",
                "content-type"
            ]
        );
        assert!(!r.raw_body.is_empty());
    }
}
