//! The rules file: envoyproxy/ratelimit's YAML format (plus sluice's extensions) as a serde
//! model, parsed and key-checked (the key check is `keys.rs`). Semantic checks and compilation
//! live in `compile/`.
//!
//! Keys are checked as the reference checks them (a key not in [`VALID_KEYS`] is an error,
//! `config error, unknown key 'foo'`, with the known key it likely misspells) and, unlike
//! the reference, in their place, since the reference silently ignores a known key where it
//! does not belong and the rule then does something else than it says: one of sluice's keys
//! there (`algorithm` beside `key:`), or a count beside a `rate_limit` that lacks it, is an
//! error naming where it belongs; one of the reference's (`shadow_mode` inside `rate_limit`)
//! is a warning naming it, and ignored as there, so that every file the reference loads
//! loads. Every problem in a file is reported, not just the first, each as `"<file>:
//! <message> (line L, column C; domain 'd', descriptor path 'k' > 'k2_v')"`: the reference's
//! wording first, then where (`error.rs`).

use std::fmt;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use serde_yaml::Value;

pub use super::error::ConfigError;
use super::{documents, error, hints};

mod keys;
mod overrides;
pub use keys::VALID_KEYS;
pub use overrides::{OverrideConfig, OverrideLimit};

/// A descriptor's step in a path: its `key`, or `key_value` (the reference's composite key).
pub(crate) fn final_key(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_string()
    } else {
        format!("{key}_{value}")
    }
}

/// A rules file: one domain and its descriptor tree.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct RulesFile {
    /// The domain the descriptors belong to; required.
    #[serde(default)]
    pub domain: String,
    /// The top-level descriptors.
    #[serde(default)]
    pub descriptors: Vec<DescriptorConfig>,
}

/// One node of the descriptor tree.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct DescriptorConfig {
    /// The entry key this node matches; required.
    #[serde(default)]
    pub key: String,
    /// The value this node matches: empty matches any value, `*` anywhere is a wildcard.
    #[serde(default)]
    pub value: String,
    /// The limit applied when a request's last entry stops at this node.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// More limits checked together with `rate_limit` (sluice extension).
    #[serde(default)]
    pub additional_limits: Vec<LimitConfig>,
    /// Per-value limits of a key-only or wildcard rule, in file order (sluice extension):
    /// each value counted as a rule of its own for that value would count it.
    #[serde(default, deserialize_with = "overrides::overrides")]
    pub overrides: Vec<OverrideConfig>,
    /// Nested descriptors, matched against the following request entries.
    #[serde(default)]
    pub descriptors: Vec<DescriptorConfig>,
    /// Report OK whatever the outcome (the outcome is still counted and measured).
    #[serde(default)]
    pub shadow_mode: bool,
    /// Quota mode: an over-limit status here fails the request only if every quota is over.
    #[serde(default)]
    pub quota_mode: bool,
    /// Metrics keyed by the request's actual values rather than this rule's path.
    #[serde(default)]
    pub detailed_metric: bool,
    /// Metrics include the actual value of this (key-only or wildcard) level.
    #[serde(default)]
    pub value_to_metric: bool,
    /// One counter for every value a wildcard matches, instead of one per value.
    #[serde(default)]
    pub share_threshold: bool,
    /// Free-form annotations, ignored by the limiter.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// The `rate_limit` block.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct RateLimitConfig {
    /// The window unit: second, minute, hour, day, week, month or year.
    #[serde(default)]
    pub unit: String,
    /// Hits allowed per window. Required unless `unlimited` (the reference reads a missing
    /// one as 0, which denies every request: a slip, never what was meant); `0` said
    /// explicitly is accepted and denies everything, as there.
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub requests_per_unit: Option<u32>,
    /// No limit: matching requests are never counted or denied.
    #[serde(default)]
    pub unlimited: bool,
    /// A name other rules can `replace`.
    #[serde(default)]
    pub name: String,
    /// Names of limits this one replaces when both match one request.
    #[serde(default)]
    pub replaces: Vec<ReplacesConfig>,
    /// Window length in units (sluice extension; default 1).
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub unit_multiplier: Option<u32>,
    /// `sliding_window` (default), `fixed_window`, `token_bucket` or `concurrency` (sluice
    /// extensions).
    #[serde(default)]
    pub algorithm: Option<String>,
    /// A token bucket's capacity (sluice extension; default `requests_per_unit`).
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub burst: Option<u32>,
    /// Whether denied hits are counted (sluice extension; default true, false for buckets and
    /// concurrency limits).
    #[serde(default)]
    pub strict: Option<bool>,
    /// Global mode: decide every hit against Redis, atomically (sluice extension; docs/global.md,
    /// "Exact rules"). Applies to every limit of the descriptor.
    #[serde(default)]
    pub exact: bool,
}

impl RateLimitConfig {
    /// The block's own limit: its keys that an `additional_limits` entry has too.
    pub fn limit(&self) -> LimitConfig {
        LimitConfig {
            unit: self.unit.clone(),
            requests_per_unit: self.requests_per_unit,
            unit_multiplier: self.unit_multiplier,
            algorithm: self.algorithm.clone(),
            burst: self.burst,
            strict: self.strict,
        }
    }
}

/// An entry of `additional_limits`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct LimitConfig {
    /// The window unit.
    #[serde(default)]
    pub unit: String,
    /// Hits allowed per window. Required unless `unlimited` (the reference reads a missing
    /// one as 0, which denies every request: a slip, never what was meant); `0` said
    /// explicitly is accepted and denies everything, as there.
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub requests_per_unit: Option<u32>,
    /// Window length in units (default 1).
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub unit_multiplier: Option<u32>,
    /// `sliding_window` (default), `fixed_window`, `token_bucket` or `concurrency`.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// A token bucket's capacity (default `requests_per_unit`).
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub burst: Option<u32>,
    /// Whether denied hits are counted (default true, false for buckets and concurrency
    /// limits).
    #[serde(default)]
    pub strict: Option<bool>,
}

/// An entry of `replaces`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ReplacesConfig {
    /// The name of the limit replaced.
    #[serde(default)]
    pub name: String,
}

/// A `u32` field whose type error says the range in words: serde's own ends "expected u32".
struct WholeU32;

impl Visitor<'_> for WholeU32 {
    type Value = u32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number from 0 to {}", u32::MAX)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u32, E> {
        u32::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
        u32::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }
}

fn whole_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    d.deserialize_u32(WholeU32)
}

fn optional_whole_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Option::<Whole>::deserialize(d).map(|o| o.map(|w| w.0))
}

/// [`WholeU32`] as a type, so `Option` handles `null`.
struct Whole(u32);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        whole_u32(d).map(Whole)
    }
}

/// Parses one rules file, reporting every key and syntax problem in it (its warnings are
/// dropped: [`parse_lenient`] has them).
///
/// # Errors
/// Every problem found, each naming `file`, and the line, column and descriptor path of
/// what it is about where that is known.
pub fn parse(file: &str, content: &str) -> Result<RulesFile, Vec<ConfigError>> {
    match parse_lenient(file, content) {
        Parsed {
            file: Some(rf),
            errors,
            ..
        } if errors.is_empty() => Ok(rf),
        Parsed { mut errors, .. } => {
            error::resolve(&mut errors, file, content);
            Err(errors)
        }
    }
}

/// What [`parse_lenient`] made of one rules file.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The file, when it could be decoded.
    pub file: Option<RulesFile>,
    /// Every key and syntax problem: the file is not loaded when there is one.
    pub errors: Vec<ConfigError>,
    /// What the reference lets pass and sluice accepts too, but names, since it is likely a
    /// slip: a key of the reference's out of place (ignored, there and here), a document
    /// after the first (never read).
    pub warnings: Vec<ConfigError>,
}

/// Parses one rules file, returning what could be decoded alongside every key and syntax
/// problem and every warning. Unknown and misplaced keys do not stop decoding (the rest of
/// the file is still checked), so a caller can report the file's semantic errors in the same
/// pass. Only the file's first YAML document is read, as the reference reads it
/// (`documents.rs`). A file past the size or nesting bounds of `prescan.rs` is refused
/// unparsed. The errors and warnings name the node they are about; `error::resolve` gives
/// them lines.
pub fn parse_lenient(file: &str, content: &str) -> Parsed {
    let failed = |message: String| Parsed {
        errors: vec![ConfigError::new(file, message)],
        ..Parsed::default()
    };
    // Before the parser: pathological nesting costs it quadratic time (see `prescan.rs`).
    if let Err(e) = super::prescan::check(content) {
        return failed(format!("error loading config file: {e}"));
    }
    let mut documents = serde_yaml::Deserializer::from_str(content);
    let value = match documents.next().map_or(Ok(Value::Null), Value::deserialize) {
        Ok(v) => v,
        Err(e) => return failed(load_error(&e, content)),
    };
    let ignored = documents::ignored(file, documents);
    let mut parsed = Parsed::default();
    match &value {
        // An empty file decodes to the default: the missing domain is reported by compile.
        Value::Null => parsed.file = Some(RulesFile::default()),
        Value::Mapping(map) => {
            let domain = map
                .get("domain")
                .and_then(Value::as_str)
                .unwrap_or_default();
            keys::check(file, domain, map, &mut parsed);
            // Decoded again from the text (not from `value`) so type errors keep their field
            // path and line.
            match RulesFile::deserialize(documents::first(content)) {
                Ok(rf) => parsed.file = Some(rf),
                Err(e) => parsed
                    .errors
                    .push(ConfigError::new(file, load_error(&e, content))),
            }
        }
        _ => {
            return failed("error loading config file: the top level must be a mapping".to_string())
        }
    }
    // After the first document's own warnings, as it comes after them in the file.
    parsed.warnings.extend(ignored);
    parsed
}

/// The reference's words for a file the YAML decoder refused, with the likely cause of a
/// syntax slip (`hints.rs`).
fn load_error(e: &serde_yaml::Error, content: &str) -> String {
    match hints::yaml(e, content) {
        Some(hint) => format!("error loading config file: {e}; hint: {hint}"),
        None => format!("error loading config file: {e}"),
    }
}

#[cfg(test)]
mod tests;
