//! Proto3 JSON for `POST /json`: a `RateLimitRequest` in (camelCase or original field names,
//! numbers or strings for integers, enum names or numbers) and the `RateLimitResponse` out, as
//! protojson prints it (camelCase, enum names, durations as `"12s"`, default values omitted).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// What is wrong with a `POST /json` body. The text is what the HTTP 400 answer says after
/// `bad request: `, so each variant keeps the wording clients have seen.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// Not JSON, or not a `RateLimitRequest`: a field unknown or of the wrong type.
    #[error("{0}")]
    Decode(#[from] serde_json::Error),
    /// An integer given as a string that is not an unsigned decimal number.
    #[error("{field}: '{text}' is not an unsigned integer")]
    NotUnsigned {
        /// The field, by its proto3 JSON name.
        field: &'static str,
        /// The string given.
        text: String,
    },
    /// An integer past a 32-bit field's range.
    #[error("{field}: {value} does not fit in 32 bits")]
    TooBig {
        /// The field, by its proto3 JSON name.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// A limit override's unit by a name the proto does not have.
    #[error("unit: unknown unit '{0}'")]
    UnknownUnit(String),
}

/// Parses a proto3 JSON `RateLimitRequest`.
///
/// # Errors
/// What is malformed (bad JSON, a field of the wrong type, an unknown enum name, an integer
/// out of range). Never panics, whatever the bytes.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let req: JsonRequest = serde_json::from_slice(body)?;
    req.into_proto()
}

/// A proto3 JSON integer: a number or a decimal string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JsonInt {
    Num(u64),
    Str(String),
}

impl JsonInt {
    fn get(&self, field: &'static str) -> Result<u64, JsonError> {
        match self {
            JsonInt::Num(n) => Ok(*n),
            JsonInt::Str(s) => s.parse().map_err(|_| JsonError::NotUnsigned {
                field,
                text: s.clone(),
            }),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JsonEnum {
    Num(i32),
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<JsonInt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<JsonInt>,
    #[serde(default, rename = "isNegativeHits", alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, rename = "requestsPerUnit", alias = "requests_per_unit")]
    requests_per_unit: Option<JsonInt>,
    #[serde(default)]
    unit: Option<JsonEnum>,
}

impl JsonRequest {
    fn into_proto(self) -> Result<RateLimitRequest, JsonError> {
        let u32_of = |v: &Option<JsonInt>, field: &'static str| -> Result<u32, JsonError> {
            v.as_ref()
                .map_or(Ok(0), |v| v.get(field))
                .and_then(|value| {
                    u32::try_from(value).map_err(|_| JsonError::TooBig { field, value })
                })
        };
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for d in self.descriptors {
            let limit = match &d.limit {
                None => None,
                Some(o) => Some(RateLimitOverride {
                    requests_per_unit: u32_of(&o.requests_per_unit, "requestsPerUnit")?,
                    unit: match &o.unit {
                        None => 0,
                        Some(JsonEnum::Num(n)) => *n,
                        Some(JsonEnum::Name(n)) => PbUnit::from_str_name(n)
                            .ok_or_else(|| JsonError::UnknownUnit(n.clone()))?
                            as i32,
                    },
                }),
            };
            let hits_addend = match &d.hits_addend {
                None => None,
                Some(h) => Some(envoy_types::pb::google::protobuf::UInt64Value {
                    value: h.get("hitsAddend")?,
                }),
            };
            descriptors.push(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit,
                hits_addend,
                is_negative_hits: d.is_negative_hits,
            });
        }
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: u32_of(&self.hits_addend, "hitsAddend")?,
        })
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A response in proto3 JSON, as protojson prints it (default values omitted).
pub fn response_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), code_name(r.overall_code).into());
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), code_name(s.code).into());
            if let Some(l) = &s.current_limit {
                let mut lm = Map::new();
                if !l.name.is_empty() {
                    lm.insert("name".into(), l.name.clone().into());
                }
                if l.requests_per_unit != 0 {
                    lm.insert("requestsPerUnit".into(), l.requests_per_unit.into());
                }
                lm.insert(
                    "unit".into(),
                    PbUnit::try_from(l.unit)
                        .map_or("UNKNOWN", |u| u.as_str_name())
                        .into(),
                );
                m.insert("currentLimit".into(), lm.into());
            }
            if s.limit_remaining != 0 {
                m.insert("limitRemaining".into(), s.limit_remaining.into());
            }
            if let Some(d) = &s.duration_until_reset {
                m.insert(
                    "durationUntilReset".into(),
                    format!("{}s", d.seconds).into(),
                );
            }
            Value::Object(m)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), statuses.into());
    }
    if !r.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), headers.into());
    }
    if !r.raw_body.is_empty() {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(&r.raw_body);
        out.insert("rawBody".into(), body.into());
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of parsing `body`, as the 400 answer prints it.
    fn error(body: &str) -> String {
        parse_request(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn errors_say_what_is_malformed_in_the_words_clients_have_seen() {
        assert_eq!(
            error(r#"{"domain":"d","hitsAddend":"x"}"#),
            "hitsAddend: 'x' is not an unsigned integer"
        );
        assert_eq!(
            error(r#"{"domain":"d","descriptors":[{"hits_addend":"-1"}]}"#),
            "hitsAddend: '-1' is not an unsigned integer"
        );
        assert_eq!(
            error(r#"{"domain":"d","hitsAddend":4294967296}"#),
            "hitsAddend: 4294967296 does not fit in 32 bits"
        );
        assert_eq!(
            error(r#"{"descriptors":[{"limit":{"requestsPerUnit":"4294967296"}}]}"#),
            "requestsPerUnit: 4294967296 does not fit in 32 bits"
        );
        assert_eq!(
            error(r#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#),
            "unit: unknown unit 'FORTNIGHT'"
        );
        assert_eq!(
            error(r#"{"domain":"d","bogus":1}"#),
            serde_json::from_str::<JsonRequest>(r#"{"domain":"d","bogus":1}"#)
                .unwrap_err()
                .to_string()
        );
        assert!(
            error("{not json").contains("key must be a string"),
            "{}",
            error("{not json")
        );
    }

    #[test]
    fn a_request_in_either_spelling_parses() {
        let req = parse_request(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requests_per_unit":"7","unit":3},"hitsAddend":"2"}],"hits_addend":4}"#,
        )
        .unwrap();
        assert_eq!((req.domain.as_str(), req.hits_addend), ("d", 4));
        let d = &req.descriptors[0];
        assert_eq!(
            d.limit,
            Some(RateLimitOverride {
                requests_per_unit: 7,
                unit: 3
            })
        );
        assert_eq!(d.hits_addend.as_ref().map(|h| h.value), Some(2));
    }
}
