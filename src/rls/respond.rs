//! Step 4 of a request: statuses in request order, the overall code (quota and shadow modes),
//! the rate-limit response headers and the dynamic metadata.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, ListValue, Struct, Value};
use std::collections::HashMap;

use super::resolve::Target;
use super::{HeaderNames, Options};
use crate::core::decide::Outcome;
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

/// `RESPONSE_DYNAMIC_METADATA`: the reference's shape. `domain`; `descriptors`, one struct per
/// request descriptor (`entries` as `key=value` strings, `limit` for an override, and its
/// own `hitsAddend` when set); the request's `hitsAddend` when not 0; and `metadata`, the
/// deep merge of the rule `metadata` of the descriptors within their limits (the first
/// descriptor's value wins where two disagree, as in the reference).
pub(super) fn dynamic_metadata(
    req: &RateLimitRequest,
    targets: &[Target<'_>],
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_string(), string(&req.domain));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut f = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(&format!("{}={}", e.key, e.value)));
            f.insert("entries".to_string(), list(entries.collect()));
            if let Some(l) = &d.limit {
                let unit = PbUnit::try_from(l.unit).unwrap_or(PbUnit::Unknown);
                let text = format!(
                    "requests_per_unit:{} unit:{}",
                    l.requests_per_unit,
                    unit.as_str_name()
                );
                f.insert("limit".to_string(), string(&text));
            }
            if let Some(h) = &d.hits_addend {
                f.insert("hitsAddend".to_string(), number(h.value as f64));
            }
            structure(Struct { fields: f })
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if req.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(f64::from(req.hits_addend)));
    }
    let mut merged = Struct::default();
    for (t, s) in targets.iter().zip(statuses) {
        // Unlimited descriptors are not among those that passed, in the reference.
        let rule = t
            .rule()
            .filter(|r| !r.unlimited && s.code == Code::Ok as i32);
        if let Some(meta) = rule.and_then(|r| r.metadata.as_deref()) {
            if let Kind::StructValue(src) = yaml_value(meta).kind.unwrap_or(Kind::NullValue(0)) {
                merge(&mut merged, src);
            }
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_string(), structure(merged));
    }
    Struct { fields }
}

/// Adds `src`'s fields to `dest`: structs on both sides merge, anything else already there
/// stays.
fn merge(dest: &mut Struct, src: Struct) {
    for (k, v) in src.fields {
        match (dest.fields.get_mut(&k), v.kind) {
            (
                Some(Value {
                    kind: Some(Kind::StructValue(d)),
                }),
                Some(Kind::StructValue(s)),
            ) => merge(d, s),
            (Some(_), _) => {}
            (None, kind) => {
                dest.fields.insert(k, Value { kind });
            }
        }
    }
}

/// A rules-file value as a protobuf value: mappings become structs (keys as text), numbers
/// doubles, tags are dropped.
fn yaml_value(v: &serde_yaml::Value) -> Value {
    use serde_yaml::Value as Y;
    match v {
        Y::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        Y::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        Y::Number(n) => number(n.as_f64().unwrap_or(0.0)),
        Y::String(s) => string(s),
        Y::Sequence(items) => list(items.iter().map(yaml_value).collect()),
        Y::Mapping(m) => structure(Struct {
            fields: m
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        Y::String(s) => s.clone(),
                        other => serde_yaml::to_string(other)
                            .unwrap_or_default()
                            .trim_end()
                            .to_string(),
                    };
                    (key, yaml_value(v))
                })
                .collect(),
        }),
        Y::Tagged(t) => yaml_value(&t.value),
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}
