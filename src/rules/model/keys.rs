//! The key check of a rules file: every key known (the reference's check, an unknown key
//! named with the known one it is likely a misspelling of) and in its place (sluice's): each
//! of sluice's own keys out of place is an error naming where the key belongs, each of the
//! reference's a warning that it is ignored, as the reference ignores it.

use serde_yaml::Value;

use super::{final_key, Parsed};
use crate::rules::error::{place, ConfigError};
use crate::rules::hints;
use crate::rules::locate::Step;

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
    "overrides",
];

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
    /// A descriptor's `overrides`: its keys are request values, not the format's.
    Overrides,
    /// A limit in `overrides`.
    OverrideLimit,
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
    "overrides",
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

/// envoyproxy/ratelimit's own keys: out of place they are ignored, as the reference does,
/// with a warning; sluice's keys out of place are errors (an ignored `algorithm` or `strict`
/// would change what is counted).
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
    /// The keys a mapping here may hold.
    fn keys(self) -> impl Iterator<Item = &'static str> {
        let (own, more): (&[&str], &[&str]) = match self {
            Place::Root => (ROOT_KEYS, &[]),
            Place::Descriptor => (DESCRIPTOR_KEYS, &[]),
            Place::RateLimit => (LIMIT_KEYS, RULE_KEYS),
            Place::AdditionalLimit | Place::OverrideLimit => (LIMIT_KEYS, &[]),
            Place::Replaces => (&["name"], &[]),
            Place::Overrides | Place::Other => (VALID_KEYS, &[]),
        };
        own.iter().chain(more).copied()
    }

    fn allows(self, key: &str) -> bool {
        self.keys().any(|k| k == key)
    }

    /// The known key an unknown `key` here likely misspells: one this place holds first,
    /// else any the format knows (it may then be out of place, which the next check says).
    fn did_you_mean(self, key: &str) -> Option<&'static str> {
        hints::did_you_mean(key, self.keys())
            .or_else(|| hints::did_you_mean(key, VALID_KEYS.iter().copied()))
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
            Place::AdditionalLimit | Place::OverrideLimit if in_limit => {
                "it applies to the whole rule: it belongs inside 'rate_limit'"
            }
            Place::AdditionalLimit => "it belongs in the descriptor, beside 'additional_limits'",
            Place::OverrideLimit => "it belongs in the descriptor, beside 'overrides'",
            Place::Root | Place::Overrides | Place::Other => "it does not belong here",
        }
    }

    /// The place of a mapping found under `key` here.
    fn child(self, key: &str) -> Place {
        match (self, key) {
            (Place::Root | Place::Descriptor, "descriptors") => Place::Descriptor,
            (Place::Descriptor, "rate_limit") => Place::RateLimit,
            (Place::Descriptor, "additional_limits") => Place::AdditionalLimit,
            (Place::Descriptor, "overrides") => Place::Overrides,
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
    warnings: &'a mut Vec<ConfigError>,
    /// The steps from the top to the mapping being checked.
    node: Vec<Step>,
    /// The descriptors' `key`/`key_value` from the top to the mapping being checked.
    path: Vec<String>,
}

impl KeyCheck<'_> {
    fn error(&mut self, message: String, node: Vec<Step>) {
        let e = self.about(message, node);
        self.errors.push(e);
    }

    fn warning(&mut self, message: String, node: Vec<Step>) {
        let w = self.about(message, node);
        self.warnings.push(w);
    }

    /// A problem about the node at `node`, in the current descriptor's place.
    fn about(&self, message: String, node: Vec<Step>) -> ConfigError {
        ConfigError::new(self.file, message).at(node, place(self.domain, &self.path))
    }

    fn mapping(&mut self, map: &serde_yaml::Mapping, here: Place) {
        if here == Place::Overrides {
            return self.overrides(map);
        }
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
                let guess = here
                    .did_you_mean(key)
                    .map(|k| format!("; did you mean '{k}'?"))
                    .unwrap_or_default();
                self.error(format!("config error, unknown key '{key}'{guess}"), at_key);
                continue;
            };
            if !here.allows(key) {
                // The reference accepts its own keys anywhere and ignores them out of place;
                // a file it loads loads here too, but the slip is named: a `shadow_mode`
                // inside `rate_limit` leaves the limit enforced. The reference loads no file
                // with `overrides`.
                if REFERENCE_KEYS.contains(&key)
                    && !slipped_out(map, here, key)
                    && here != Place::OverrideLimit
                {
                    self.warning(
                        format!(
                            "misplaced key '{key}' is ignored, as envoyproxy/ratelimit ignores it: {}",
                            here.belongs(key)
                        ),
                        at_key,
                    );
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

    /// An `overrides` map: its keys are request values, so only the limits' mappings among
    /// its values have keys to check (a count, or a value of another type, is the decoder's).
    fn overrides(&mut self, map: &serde_yaml::Mapping) {
        for (i, v) in map.values().enumerate() {
            if let Value::Mapping(limit) = v {
                self.node.push(Step::Entry(i));
                self.mapping(limit, Place::OverrideLimit);
                self.node.pop();
            }
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

/// Checks every key of a file's top-level mapping and of the mappings in it, adding to
/// `parsed` an error for each unknown key or misplaced key of sluice's, a warning for each
/// misplaced key of the reference's.
pub(super) fn check(file: &str, domain: &str, map: &serde_yaml::Mapping, parsed: &mut Parsed) {
    let mut check = KeyCheck {
        file,
        domain,
        errors: &mut parsed.errors,
        warnings: &mut parsed.warnings,
        node: Vec::new(),
        path: Vec::new(),
    };
    check.mapping(map, Place::Root);
}
