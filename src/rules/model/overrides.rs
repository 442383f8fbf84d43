//! A rule's `overrides` map (sluice extension) as the model decodes it: each request value with
//! a limit of its own, in file order, a key written as a number or a boolean read as its text
//! (as `value:` is), each limit a bare count or a whole limit's mapping.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::{LimitConfig, WholeU32};

/// An entry of a descriptor's `overrides`: one request value and its limit.
#[derive(Debug, Clone, PartialEq)]
pub struct OverrideConfig {
    /// The request value the limit is for.
    pub value: String,
    /// Its limit, in place of the one `rate_limit` says.
    pub limit: OverrideLimit,
}

/// What an override says.
#[derive(Debug, Clone, PartialEq)]
pub enum OverrideLimit {
    /// `acme: 1000`: a `requests_per_unit` in place of the rule's, with the rule's unit and
    /// other limit keys.
    Count(u32),
    /// `acme: {unit: second, requests_per_unit: 50}`: a whole limit in place of `rate_limit`'s
    /// (the keys of an `additional_limits` entry).
    Limit(LimitConfig),
}

/// Decodes `overrides` in file order: a map would lose the order errors are reported in,
/// and with it which of two equal values is the duplicate.
pub(super) fn overrides<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<OverrideConfig>, D::Error> {
    struct Entries;

    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<OverrideConfig>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of request values to limits")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut entries = Vec::new();
            while let Some(Text(value)) = map.next_key()? {
                let limit = map.next_value()?;
                entries.push(OverrideConfig { value, limit });
            }
            Ok(entries)
        }
    }

    d.deserialize_any(Entries)
}

/// A scalar key as its text: `123:` is the value `"123"`, as `value: 123` is.
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Scalar;

        impl Visitor<'_> for Scalar {
            type Value = String;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request value (a string, a number or a boolean)")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
                Ok(v.to_string())
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
                Ok(v.to_string())
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
                Ok(v.to_string())
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
                Ok(v.to_string())
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
                Ok(v.to_string())
            }
        }

        d.deserialize_any(Scalar).map(Text)
    }
}

impl<'de> Deserialize<'de> for OverrideLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;

        impl<'de> Visitor<'de> for Either {
            type Value = OverrideLimit;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "requests_per_unit (a whole number from 0 to {}) or a limit (a map with unit, requests_per_unit, ...)",
                    u32::MAX
                )
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<OverrideLimit, E> {
                WholeU32.visit_u64(v).map(OverrideLimit::Count)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<OverrideLimit, E> {
                WholeU32.visit_i64(v).map(OverrideLimit::Count)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<OverrideLimit, A::Error> {
                LimitConfig::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(OverrideLimit::Limit)
            }
        }

        d.deserialize_any(Either)
    }
}
