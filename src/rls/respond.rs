//! Step 4 of a request: statuses in request order, the overall code (quota and shadow modes),
//! and the rate-limit response headers.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use super::evaluate::Outcome;
use super::{HeaderNames, Options};
use crate::rules::{Rule, Unit};

/// Statuses gathered in request order, with what the overall code needs.
#[derive(Default)]
pub(super) struct Response {
    statuses: Vec<DescriptorStatus>,
    /// Per status: seconds until a refused request would be admitted (`Retry-After`).
    retry_secs: Vec<u64>,
    non_quota_over: bool,
    quotas: usize,
    quotas_over: usize,
}

impl Response {
    /// A response for `n` descriptors.
    pub(super) fn with_capacity(n: usize) -> Self {
        Response {
            statuses: Vec::with_capacity(n),
            retry_secs: Vec::with_capacity(n),
            ..Default::default()
        }
    }

    /// A descriptor no rule applies to: OK, no limit, 0 left.
    pub(super) fn no_rule(&mut self) {
        self.retry_secs.push(0);
        self.statuses.push(DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        });
    }

    /// An unlimited descriptor: OK, no limit, `u32::MAX` left.
    pub(super) fn unlimited(&mut self) {
        self.retry_secs.push(0);
        self.statuses.push(DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        });
    }

    /// A limited descriptor's status. Rule `shadow_mode` reports over as OK.
    pub(super) fn limited(&mut self, rule: &Rule, outcome: &Outcome, opts: &Options) {
        let reported_over = outcome.over && !rule.shadow_mode;
        if rule.quota_mode || opts.quota_mode {
            self.quotas += 1;
            self.quotas_over += usize::from(reported_over);
        } else {
            self.non_quota_over |= reported_over;
        }
        let spec = &rule.limits[outcome.reported];
        self.retry_secs
            .push(outcome.verdict.retry_ms.div_ceil(1000));
        self.statuses.push(DescriptorStatus {
            code: if reported_over {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            current_limit: Some(PbRateLimit {
                name: rule.name.clone(),
                requests_per_unit: spec.limit.requests_per_unit,
                unit: pb_unit(spec.unit) as i32,
            }),
            limit_remaining: outcome.verdict.remaining,
            duration_until_reset: Some(PbDuration {
                seconds: outcome.verdict.reset_ms.div_ceil(1000) as i64,
                nanos: 0,
            }),
            quota: None,
        });
    }

    /// The response: OVER_LIMIT iff a non-quota descriptor is over or every quota one is
    /// (there is one), unless global shadow mode says OK.
    pub(super) fn finish(self, opts: &Options) -> RateLimitResponse {
        let over = self.non_quota_over || (self.quotas > 0 && self.quotas == self.quotas_over);
        let overall = if over && !opts.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let response_headers_to_add = match &opts.response_headers {
            Some(names) => headers(
                names,
                &self.statuses,
                &self.retry_secs,
                overall == Code::OverLimit,
            ),
            None => Vec::new(),
        };
        RateLimitResponse {
            overall_code: overall as i32,
            statuses: self.statuses,
            response_headers_to_add,
            ..Default::default()
        }
    }
}

fn pb_unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

pub(super) fn rule_unit(u: PbUnit) -> Unit {
    match u {
        PbUnit::Unknown | PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
    }
}

/// The rate-limit headers from the most restrictive limited descriptor: an over-limit one
/// wins, else the one with the fewest hits left. `Retry-After` is added when the request is
/// refused: when the picked descriptor would admit it again (its window's end, or the time its
/// bucket takes to hold the tokens).
fn headers(
    names: &HeaderNames,
    statuses: &[DescriptorStatus],
    retry_secs: &[u64],
    refused: bool,
) -> Vec<HeaderValue> {
    let reset = |s: &DescriptorStatus| s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    let Some((i, pick)) = statuses
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
    else {
        return Vec::new();
    };
    let limit = pick
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let header = |k: &str, v: String| HeaderValue {
        key: k.to_string(),
        value: v,
        ..Default::default()
    };
    let mut out = vec![
        header(&names.limit, limit.to_string()),
        header(&names.remaining, pick.limit_remaining.to_string()),
        header(&names.reset, reset(pick).to_string()),
    ];
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
