//! The rules file: envoyproxy/ratelimit's YAML format (plus sluice's extensions) as a serde
//! model, parsed and key-checked. Semantic checks and compilation live in `compile.rs`.
//!
//! Keys are checked as the reference checks them (a key not in [`VALID_KEYS`] is an error,
//! `config error, unknown key 'foo'`) and, unlike the reference, in their place: a known key
//! where it does not belong (`requests_per_unit` beside `key:`, `shadow_mode` inside
//! `rate_limit`) is an error naming where it belongs, since the reference silently ignores
//! it and the rule then does something else than it says. Every problem in a file is
//! reported, not just the first, each as `"<file>: <message> (line L, column C; domain 'd',
//! descriptor path 'k' > 'k2_v')"`: the reference's wording first, then where (`locate.rs`).

use std::fmt;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use serde_yaml::Value;

use super::locate::{self, Step};

/// Every key the rules format knows: the reference's, then sluice's extensions.
pub const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // sluice extensions
    "algorithm",
    "burst",
    "unit_multiplier",
    "additional_limits",
    "strict",
    "exact",
];

/// One error in one rules file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}{}", self.whereabouts())]
pub struct ConfigError {
    /// The file the error is in, as it was named to the loader.
    pub file: String,
    /// What is wrong, in envoyproxy/ratelimit's wording where it has one.
    pub message: String,
    /// The 1-based line of the error's subject in the file, when known (u32: a rules file
    /// is at most 4 MiB, and the error stays small).
    pub line: Option<u32>,
    /// The 1-based column of the error's subject, with `line`.
    pub column: Option<u32>,
    /// The domain and descriptor path the error is in (`domain 'edge', descriptor path
    /// 'remote_address' > 'path_/api'`), when it is in one.
    pub place: Option<String>,
    /// The node the error is about, still to be given a line (see `locate.rs`).
    pub(crate) node: Option<Vec<Step>>,
}

impl ConfigError {
    /// An error in `file`.
    pub fn new(file: &str, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_string(),
            message: message.into(),
            line: None,
            column: None,
            place: None,
            node: None,
        }
    }

    /// The error, about the node at `node` (located later, from the text) in `place`.
    pub(crate) fn at(mut self, node: Vec<Step>, place: Option<String>) -> Self {
        self.node = Some(node);
        self.place = place;
        self
    }

    /// ` (line 5, column 7; domain 'edge', descriptor path 'a' > 'b')`, or what of it is known.
    fn whereabouts(&self) -> String {
        let line = match (self.line, self.column) {
            (Some(l), Some(c)) => Some(format!("line {l}, column {c}")),
            (Some(l), None) => Some(format!("line {l}")),
            _ => None,
        };
        match (line, &self.place) {
            (Some(l), Some(p)) => format!(" ({l}; {p})"),
            (Some(l), None) => format!(" ({l})"),
            (None, Some(p)) => format!(" ({p})"),
            (None, None) => String::new(),
        }
    }
}

/// The words that place an error in a domain's tree: `domain 'edge', descriptor path
/// 'remote_address' > 'path_/api'`, each step a descriptor's `key` or `key_value`.
pub(crate) fn place(domain: &str, path: &[String]) -> Option<String> {
    let steps = path
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(" > ");
    match (domain.is_empty(), path.is_empty()) {
        (true, true) => None,
        (false, true) => Some(format!("domain '{domain}'")),
        (true, false) => Some(format!("descriptor path {steps}")),
        (false, false) => Some(format!("domain '{domain}', descriptor path {steps}")),
    }
}

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
    /// `sliding_window` (default), `fixed_window` or `token_bucket` (sluice extension).
    #[serde(default)]
    pub algorithm: Option<String>,
    /// A token bucket's capacity (sluice extension; default `requests_per_unit`).
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub burst: Option<u32>,
    /// Whether denied hits are counted (sluice extension; default true, false for buckets).
    #[serde(default)]
    pub strict: Option<bool>,
    /// Global mode: decide every hit against Redis, atomically (sluice extension; README,
    /// "Exact rules"). Applies to every limit of the descriptor.
    #[serde(default)]
    pub exact: bool,
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
    /// `sliding_window` (default), `fixed_window` or `token_bucket`.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// A token bucket's capacity (default `requests_per_unit`).
    #[serde(default, deserialize_with = "optional_whole_u32")]
    pub burst: Option<u32>,
    /// Whether denied hits are counted (default true, false for buckets).
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

/// Parses one rules file, reporting every key and syntax problem in it.
///
/// # Errors
/// Every problem found, each naming `file`, and the line, column and descriptor path of
/// what it is about where that is known.
pub fn parse(file: &str, content: &str) -> Result<RulesFile, Vec<ConfigError>> {
    match parse_lenient(file, content) {
        (Some(rf), errors) if errors.is_empty() => Ok(rf),
        (_, mut errors) => {
            locate::resolve(&mut errors, file, content);
            Err(errors)
        }
    }
}

/// Parses one rules file, returning what could be decoded alongside every key and syntax
/// problem. Unknown and misplaced keys do not stop decoding (the rest of the file is still
/// checked), so a caller can report the file's semantic errors in the same pass. A file past
/// the size or nesting bounds of `prescan.rs` is refused unparsed. The errors name the node
/// they are about; `locate::resolve` gives them lines.
pub fn parse_lenient(file: &str, content: &str) -> (Option<RulesFile>, Vec<ConfigError>) {
    // Before the parser: pathological nesting costs it quadratic time (see `prescan.rs`).
    if let Err(e) = super::prescan::check(content) {
        let err = ConfigError::new(file, format!("error loading config file: {e}"));
        return (None, vec![err]);
    }
    let value: Value = match serde_yaml::from_str(content) {
        Ok(v) => v,
        Err(e) => {
            let err = ConfigError::new(file, format!("error loading config file: {e}"));
            return (None, vec![err]);
        }
    };
    let mut errors = Vec::new();
    match &value {
        // An empty file decodes to the default: the missing domain is reported by compile.
        Value::Null => return (Some(RulesFile::default()), errors),
        Value::Mapping(map) => {
            let domain = map
                .get("domain")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut check = KeyCheck {
                file,
                domain,
                errors: &mut errors,
                node: Vec::new(),
                path: Vec::new(),
            };
            check.mapping(map, Place::Root);
        }
        _ => {
            let err = ConfigError::new(
                file,
                "error loading config file: the top level must be a mapping",
            );
            return (None, vec![err]);
        }
    }
    // Decoded again from the text (not from `value`) so type errors keep their field path
    // and line.
    match serde_yaml::from_str(content) {
        Ok(rf) => (Some(rf), errors),
        Err(e) => {
            errors.push(ConfigError::new(
                file,
                format!("error loading config file: {e}"),
            ));
            (None, errors)
        }
    }
}

/// Where a mapping sits in a rules file, which decides the keys it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The file's top level.
    Root,
    /// An entry of `descriptors`.
    Descriptor,
    /// A descriptor's `rate_limit`.
    RateLimit,
    /// An entry of `additional_limits`.
    AdditionalLimit,
    /// An entry of `replaces`.
    Replaces,
    /// Inside a value no mapping belongs in (the decoder reports its type): only the
    /// reference's check applies, that every key is one the format knows.
    Other,
}

/// The top level's own keys.
const ROOT_KEYS: &[&str] = &["domain", "descriptors"];

/// A descriptor's own keys.
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "additional_limits",
];

/// The keys of one limit: an `additional_limits` entry holds these.
const LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unit_multiplier",
    "algorithm",
    "burst",
    "strict",
];

/// envoyproxy/ratelimit's own keys: out of place they are ignored, as the reference does;
/// sluice's keys out of place are errors (an ignored `algorithm` or `strict` would change
/// what is counted).
const REFERENCE_KEYS: &[&str] = &[
    "domain",
    "descriptors",
    "key",
    "value",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Whether `key`, beside a descriptor's `rate_limit` that lacks it, is a limit's key one
/// level too far out: the limit it belongs to would be 0 per unit, or have no unit, and
/// deny every request (that `rate_limit` is reported as incomplete too).
fn slipped_out(map: &serde_yaml::Mapping, here: Place, key: &str) -> bool {
    here == Place::Descriptor
        && matches!(key, "requests_per_unit" | "unit")
        && map.get("rate_limit").is_some_and(|limit| {
            limit
                .as_mapping()
                .is_none_or(|limit| !limit.contains_key(key))
        })
}

/// `rate_limit`'s keys besides [`LIMIT_KEYS`]: they apply to the whole rule.
const RULE_KEYS: &[&str] = &["unlimited", "name", "replaces", "exact"];

impl Place {
    fn allows(self, key: &str) -> bool {
        match self {
            Place::Root => ROOT_KEYS.contains(&key),
            Place::Descriptor => DESCRIPTOR_KEYS.contains(&key),
            Place::RateLimit => LIMIT_KEYS.contains(&key) || RULE_KEYS.contains(&key),
            Place::AdditionalLimit => LIMIT_KEYS.contains(&key),
            Place::Replaces => key == "name",
            Place::Other => true,
        }
    }

    /// Where `key`, known but not allowed here, belongs: the likely slip, in words.
    fn belongs(self, key: &str) -> &'static str {
        let in_limit = LIMIT_KEYS.contains(&key) || RULE_KEYS.contains(&key);
        let in_descriptor = DESCRIPTOR_KEYS.contains(&key);
        match self {
            _ if key == "domain" => "it belongs at the top of the file",
            Place::Replaces => "a 'replaces' entry holds only 'name'",
            Place::Root if in_descriptor => {
                "it belongs in a descriptor (an entry of 'descriptors')"
            }
            Place::Root if in_limit => {
                "it belongs inside a descriptor's 'rate_limit'"
            }
            Place::Descriptor if key == "strict" => {
                "it belongs inside 'rate_limit' or an 'additional_limits' entry, one level further in"
            }
            Place::Descriptor => "it belongs inside 'rate_limit', one level further in",
            Place::RateLimit => "it belongs in the descriptor, beside 'rate_limit', one level further out",
            Place::AdditionalLimit if in_limit => {
                "it applies to the whole rule: it belongs inside 'rate_limit'"
            }
            Place::AdditionalLimit => "it belongs in the descriptor, beside 'additional_limits'",
            Place::Root | Place::Other => "it does not belong here",
        }
    }

    /// The place of a mapping found under `key` here.
    fn child(self, key: &str) -> Place {
        match (self, key) {
            (Place::Root | Place::Descriptor, "descriptors") => Place::Descriptor,
            (Place::Descriptor, "rate_limit") => Place::RateLimit,
            (Place::Descriptor, "additional_limits") => Place::AdditionalLimit,
            (Place::RateLimit, "replaces") => Place::Replaces,
            _ => Place::Other,
        }
    }
}

/// The key check: every key known (the reference's check) and in its place (sluice's: a
/// rate limit key beside `key:`, or a descriptor key inside `rate_limit`, is an indentation
/// slip that would otherwise be ignored, or read as a limit of 0).
struct KeyCheck<'a> {
    file: &'a str,
    domain: &'a str,
    errors: &'a mut Vec<ConfigError>,
    /// The steps from the top to the mapping being checked.
    node: Vec<Step>,
    /// The descriptors' `key`/`key_value` from the top to the mapping being checked.
    path: Vec<String>,
}

impl KeyCheck<'_> {
    fn error(&mut self, message: String, node: Vec<Step>) {
        let place = place(self.domain, &self.path);
        self.errors
            .push(ConfigError::new(self.file, message).at(node, place));
    }

    fn mapping(&mut self, map: &serde_yaml::Mapping, here: Place) {
        for (k, v) in map {
            let Some(key) = k.as_str() else {
                let node = self.node.clone();
                self.error(
                    format!("config error, key is not of type string: {}", render(k)),
                    node,
                );
                continue;
            };
            let mut at_key = self.node.clone();
            at_key.push(Step::KeyItself(key.to_string()));
            let Some(known) = VALID_KEYS.iter().find(|k| **k == key) else {
                self.error(format!("config error, unknown key '{key}'"), at_key);
                continue;
            };
            if !here.allows(key) {
                if REFERENCE_KEYS.contains(&key) && !slipped_out(map, here, key) {
                    // The reference accepts its own keys anywhere and ignores them out of
                    // place; a file it loads loads here too.
                    continue;
                }
                self.error(
                    format!("config error, misplaced key '{key}': {}", here.belongs(key)),
                    at_key,
                );
                continue;
            }
            if *known == "metadata" {
                continue; // free-form by design
            }
            let child = here.child(key);
            self.node.push(Step::Key(known));
            match v {
                Value::Sequence(items) => {
                    for (i, item) in items.iter().enumerate() {
                        self.node.push(Step::Index(i));
                        match item {
                            Value::Mapping(m) => self.entry(m, child),
                            other => {
                                let node = self.node.clone();
                                self.error(
                                    format!(
                                        "config error, yaml file contains list of type other than map: {}",
                                        render(other)
                                    ),
                                    node,
                                );
                            }
                        }
                        self.node.pop();
                    }
                }
                Value::Mapping(m) => self.entry(m, child),
                // The reference accepts only strings, integers and booleans as leaves.
                Value::Number(n) if n.is_f64() => {
                    let node = self.node.clone();
                    self.error(
                        format!("error checking config: '{key}' has the non-integer value {n}"),
                        node,
                    );
                }
                _ => {}
            }
            self.node.pop();
        }
    }

    /// A mapping at `place`; a descriptor adds its step to the path for what is inside.
    fn entry(&mut self, map: &serde_yaml::Mapping, place: Place) {
        if place != Place::Descriptor {
            return self.mapping(map, place);
        }
        // As the decoder reads them: a plain `429` or `true` is its text.
        let text = |k: &str| match map.get(k) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::Bool(b)) => b.to_string(),
            _ => String::new(),
        };
        self.path.push(final_key(&text("key"), &text("value")));
        self.mapping(map, place);
        self.path.pop();
    }
}

fn render(v: &Value) -> String {
    serde_yaml::to_string(v)
        .map(|s| s.trim().replace('\n', " "))
        .unwrap_or_else(|_| format!("{v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_reference_format() {
        let f = parse(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: n\n      replaces:\n        - name: m\n",
        )
        .unwrap();
        assert_eq!(f.domain, "d");
        let rl = f.descriptors[0].rate_limit.as_ref().unwrap();
        assert_eq!(
            (rl.unit.as_str(), rl.requests_per_unit),
            ("second", Some(5))
        );
        assert_eq!(rl.replaces[0].name, "m");
    }

    #[test]
    fn reports_every_unknown_key_with_its_line() {
        let errs = parse(
            "bad.yaml",
            "domain: d\nfoo: 1\ndescriptors:\n  - key: k\n    bar: 2\n",
        )
        .unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "bad.yaml: config error, unknown key 'foo' (line 2, column 1; domain 'd')",
                "bad.yaml: config error, unknown key 'bar' (line 5, column 5; domain 'd', descriptor path 'k')"
            ]
        );
    }

    #[test]
    fn list_of_non_maps_is_an_error() {
        let errs = parse("l.yaml", "domain: d\ndescriptors:\n  - a\n").unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "l.yaml: config error, yaml file contains list of type other than map: a (line 3, column 5; domain 'd')"
        );
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let errs = parse("s.yaml", "domain: d\ndescriptors: [\n").unwrap_err();
        assert!(errs[0].message.starts_with("error loading config file:"));
        assert!(errs[0].message.contains("line"), "{}", errs[0]);
    }

    #[test]
    fn type_errors_name_the_field() {
        let errs = parse(
            "t.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: lots\n",
        )
        .unwrap_err();
        assert!(errs[0].message.contains("requests_per_unit"), "{}", errs[0]);
    }

    #[test]
    fn metadata_is_free_form() {
        parse(
            "m.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      owner: team-a\n      anything: [1, 2]\n",
        )
        .unwrap();
    }

    #[test]
    fn counts_past_u32_say_the_range_in_words() {
        let errs = parse(
            "r.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
        )
        .unwrap_err();
        assert!(
            errs[0].message.contains("descriptors[0].rate_limit.requests_per_unit: invalid value: integer `4294967296`, expected a whole number from 0 to 4294967295"),
            "{}",
            errs[0]
        );
        let errs = parse(
            "m.yaml",
            "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: -1}\n",
        )
        .unwrap_err();
        assert!(
            errs[0]
                .message
                .contains("unit_multiplier: invalid type: integer `-1`, expected a whole number"),
            "{}",
            errs[0]
        );
        let f = parse(
            "n.yaml",
            "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: second, requests_per_unit: 4294967295, unit_multiplier: ~}\n",
        )
        .unwrap();
        let rl = f.descriptors[0].rate_limit.as_ref().unwrap();
        assert_eq!(
            (rl.requests_per_unit, rl.unit_multiplier),
            (Some(u32::MAX), None)
        );
    }

    #[test]
    fn pathological_nesting_is_refused_before_parsing() {
        let lists = format!("domain: d\ndescriptors: {}", "[".repeat(200_000));
        let maps = format!("domain: d\nmetadata: {}", "{a: ".repeat(50_000));
        for (text, line) in [(lists, 2), (maps, 2)] {
            let errs = parse("deep.yaml", &text).unwrap_err();
            assert_eq!(
                errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                vec![format!(
                    "deep.yaml: error loading config file: nesting deeper than 64 levels at line {line}"
                )]
            );
        }
        let big = format!(
            "domain: d\n#{}\n",
            "x".repeat(super::super::prescan::MAX_FILE_BYTES)
        );
        let errs = parse("big.yaml", &big).unwrap_err();
        assert!(
            errs[0]
                .message
                .ends_with("bytes, more than the 4194304 allowed"),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn ten_descriptor_levels_still_load() {
        let mut text = String::from("domain: d\ndescriptors:\n");
        for level in 0..10 {
            let pad = "    ".repeat(level);
            text += &format!("{pad}  - key: k{level}\n{pad}    rate_limit: {{unit: second, requests_per_unit: 1}}\n{pad}    metadata: {{tags: [a, [b]]}}\n{pad}    descriptors:\n");
        }
        text += &format!("{}  - key: leaf\n", "    ".repeat(10));
        let mut f = parse("ten.yaml", &text).unwrap();
        for level in 0..10 {
            assert_eq!(f.descriptors[0].key, format!("k{level}"));
            f = RulesFile {
                descriptors: f.descriptors[0].descriptors.clone(),
                ..f
            };
        }
        assert_eq!(f.descriptors[0].key, "leaf");
    }
}
