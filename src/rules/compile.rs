//! Validation and compilation of parsed rules files into a [`RuleSet`]: every error of every
//! file is collected (the reference's wording), and nothing is compiled when there is one.

use std::collections::HashMap;

use super::error::{self, place, ConfigError};
use super::identity::rule_id;
use super::locate::Step;
use super::model::{self, DescriptorConfig, LimitConfig, RulesFile};
use super::tree::{KeyLevel, Kind, Node, MAX_WILDCARD_CHECKS};
use super::{LimitSpec, Rule, RuleSet, Unit};
use crate::core::{Algorithm, Limit};

impl RuleSet {
    /// Validates and compiles parsed files (name, content). With `merge_domains`, files that
    /// share a domain are merged; otherwise a domain may appear in one file only.
    ///
    /// # Errors
    /// Every problem found in every file; nothing is compiled when there is one.
    pub fn compile(
        files: &[(String, RulesFile)],
        merge_domains: bool,
    ) -> Result<RuleSet, Vec<ConfigError>> {
        let mut set = RuleSet::default();
        let mut errors = Vec::new();
        for (name, file) in files {
            let at_domain = vec![Step::KeyItself("domain".into())];
            if file.domain.is_empty() {
                errors.push(
                    ConfigError::new(name, "config file cannot have empty domain")
                        .at(at_domain, None),
                );
                continue;
            }
            if set.domains.contains_key(&file.domain) && !merge_domains {
                errors.push(
                    ConfigError::new(
                        name,
                        format!("duplicate domain '{}' in config file", file.domain),
                    )
                    .at(at_domain, place(&file.domain, &[])),
                );
                continue;
            }
            let mut root = set.domains.remove(&file.domain).unwrap_or_default();
            let mut cx = Compiler {
                file: name,
                domain: &file.domain,
                rules: &mut set.rules,
                errors: &mut errors,
                node: vec![Step::Key("descriptors")],
                path: Vec::new(),
            };
            cx.load(
                &mut root,
                &format!("{}.", file.domain),
                &file.descriptors,
                false,
            );
            set.domains.insert(file.domain.clone(), root);
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(errors)
        }
    }
}

/// Parses and compiles rules sources given as (name, text), reporting every error of every
/// file at once: key, syntax and type problems and semantic ones alike, each with its line
/// and column in the file where they can be found (`error.rs`, `locate.rs`).
///
/// # Errors
/// Every problem found; nothing is compiled when there is one.
pub fn compile_sources(
    sources: &[(String, String)],
    merge_domains: bool,
) -> Result<RuleSet, Vec<ConfigError>> {
    let mut parsed = Vec::new();
    let mut errors = Vec::new();
    for (name, text) in sources {
        let (file, mut errs) = model::parse_lenient(name, text);
        errors.append(&mut errs);
        if let Some(f) = file {
            parsed.push((name.clone(), f));
        }
    }
    let mut result = with_prior_errors(errors, RuleSet::compile(&parsed, merge_domains));
    if let Err(errors) = &mut result {
        for (name, text) in sources {
            error::resolve(errors, name, text);
        }
    }
    result
}

/// `result`, failed when `prior` holds errors found before it (they come first): a file that
/// could not be read or parsed fails the load even when the rest compiles.
///
/// # Errors
/// `prior` followed by `result`'s own errors.
pub fn with_prior_errors(
    mut prior: Vec<ConfigError>,
    result: Result<RuleSet, Vec<ConfigError>>,
) -> Result<RuleSet, Vec<ConfigError>> {
    match result {
        Ok(set) if prior.is_empty() => Ok(set),
        Ok(_) => Err(prior),
        Err(mut e) => {
            prior.append(&mut e);
            Err(prior)
        }
    }
}

/// The longest window a limit may have: 10 years of 365 days, 3.2e11 ms (under 2^39).
///
/// Windows are counted in u64 milliseconds here and, in global mode, in the Redis script,
/// where Lua numbers are doubles, exact only up to 2^53. The arithmetic done on a window is
/// `2 × window_ms` (the key's TTL) and `epoch × window_ms` with `epoch = now_ms / window_ms`
/// (a window start, at most `now_ms + window_ms`). With `now_ms` under 2^42 (until the year
/// 2109) and the window under 2^39, every such value stays under 2^43: exact in a double and
/// far from u64's end. Ten years also keeps errors readable and is longer than any useful
/// rate limit.
pub const MAX_WINDOW_MS: u64 = 10 * 365 * 86_400_000;

// The bound above, checked where it is stated: a window start plus a TTL stays exact.
const _: () = assert!(MAX_WINDOW_MS < 1 << 39 && 2 * MAX_WINDOW_MS + (1 << 42) < 1 << 53);

struct Compiler<'a> {
    file: &'a str,
    domain: &'a str,
    rules: &'a mut Vec<Rule>,
    errors: &'a mut Vec<ConfigError>,
    /// The steps from the top of the file to the descriptor being compiled (to the
    /// `descriptors` list being walked, between descriptors).
    node: Vec<Step>,
    /// The `key`/`key_value` of each descriptor from the domain down to the current one.
    path: Vec<String>,
}

impl Compiler<'_> {
    /// An error about the current descriptor.
    fn error(&mut self, message: impl Into<String>) {
        self.error_at(&[], message);
    }

    /// An error about the node `steps` below the current descriptor.
    fn error_at(&mut self, steps: &[Step], message: impl Into<String>) {
        let node = self.node.iter().chain(steps).cloned().collect();
        let place = place(self.domain, &self.path);
        self.errors
            .push(ConfigError::new(self.file, message).at(node, place));
    }

    /// An error about the key `key` of the current descriptor.
    fn error_key(&mut self, key: &str, message: impl Into<String>) {
        self.error_at(&[Step::KeyItself(key.to_string())], message);
    }

    fn load(
        &mut self,
        level: &mut HashMap<String, KeyLevel>,
        parent_key: &str,
        descriptors: &[DescriptorConfig],
        inherited_value_to_metric: bool,
    ) {
        for (i, d) in descriptors.iter().enumerate() {
            let final_key = model::final_key(&d.key, &d.value);
            self.node.push(Step::Index(i));
            self.path.push(final_key.clone());
            self.descriptor(level, parent_key, d, final_key, inherited_value_to_metric);
            self.path.pop();
            self.node.pop();
        }
        // Only the levels that got patterns from this batch: a level merged from an earlier
        // file is indexed (and its bound reported) once per file that adds to it. The error
        // points at the level's last pattern in this batch.
        let mut last_wildcard: HashMap<&str, usize> = HashMap::new();
        for (i, d) in descriptors.iter().enumerate() {
            if d.value.contains('*') {
                last_wildcard.insert(d.key.as_str(), i);
            }
        }
        let mut last_wildcard: Vec<(usize, &str)> =
            last_wildcard.into_iter().map(|(k, i)| (i, k)).collect();
        last_wildcard.sort_unstable();
        for (i, key) in last_wildcard {
            let Some(key_level) = level.get_mut(key) else {
                continue;
            };
            let checks = key_level.index_wildcards();
            if checks > MAX_WILDCARD_CHECKS {
                let d = &descriptors[i];
                self.node.push(Step::Index(i));
                self.path.push(model::final_key(&d.key, &d.value));
                self.error_key("value", format!(
                    "the wildcard values of key '{key}' need {checks} passes over a request value, at most {MAX_WILDCARD_CHECKS} are allowed (each value with a literal between two '*' other than '*text*' takes one, and so does each nested prefix of 'prefix*suffix' values)"
                ));
                self.path.pop();
                self.node.pop();
            }
        }
    }

    /// One descriptor (the current one: `self.node` and `self.path` end with it) and what
    /// is below it.
    fn descriptor(
        &mut self,
        level: &mut HashMap<String, KeyLevel>,
        parent_key: &str,
        d: &DescriptorConfig,
        final_key: String,
        inherited_value_to_metric: bool,
    ) {
        if d.key.is_empty() {
            self.error("descriptor has empty key");
            return;
        }
        let composite = format!("{parent_key}{final_key}");
        let kind = if d.value.is_empty() {
            Kind::AnyValue
        } else if d.value.contains('*') {
            Kind::Wildcard
        } else {
            Kind::Exact
        };
        let key_level = level.entry(d.key.clone()).or_default();
        let duplicate = match kind {
            Kind::AnyValue => key_level.any_value.is_some(),
            Kind::Wildcard => key_level.has_wildcard(&d.value),
            Kind::Exact => key_level.exact.contains_key(&d.value),
        };
        if duplicate {
            self.error(format!("duplicate descriptor composite key '{composite}'"));
            return;
        }
        if d.share_threshold && kind != Kind::Wildcard {
            self.error_key("share_threshold", format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
            ));
        }
        let value_to_metric = inherited_value_to_metric || d.value_to_metric;
        let rule = self.rule(d, &composite, value_to_metric);
        let mut node = Node {
            kind,
            final_key,
            rule,
            share_threshold: d.share_threshold,
            value_to_metric: d.value_to_metric,
            children: HashMap::new(),
        };
        self.node.push(Step::Key("descriptors"));
        self.load(
            &mut node.children,
            &format!("{composite}."),
            &d.descriptors,
            value_to_metric,
        );
        self.node.pop();
        // Re-borrow: the recursive load may not hold `level`'s entry.
        let key_level = level.entry(d.key.clone()).or_default();
        match kind {
            Kind::AnyValue => key_level.any_value = Some(Box::new(node)),
            Kind::Wildcard => key_level.push_wildcard(d.value.clone(), node),
            Kind::Exact => {
                key_level.exact.insert(d.value.clone(), node);
            }
        }
    }

    fn rule(
        &mut self,
        d: &DescriptorConfig,
        composite: &str,
        value_to_metric: bool,
    ) -> Option<usize> {
        let Some(rl) = &d.rate_limit else {
            if !d.additional_limits.is_empty() {
                self.error_key(
                    "additional_limits",
                    format!("additional_limits needs a rate_limit block: '{composite}'"),
                );
            }
            return None;
        };
        let in_rate_limit = |key: &str| [Step::Key("rate_limit"), Step::KeyItself(key.to_string())];
        let unit = Unit::parse(&rl.unit);
        let mut limits = Vec::new();
        if rl.unlimited {
            if unit.is_some() {
                self.error_at(
                    &in_rate_limit("unit"),
                    "should not specify rate limit unit when unlimited",
                );
            }
            if !d.additional_limits.is_empty() {
                self.error_key(
                    "additional_limits",
                    format!("additional_limits cannot be used with unlimited: '{composite}'"),
                );
            }
            if rl.strict.is_some() {
                self.error_at(
                    &in_rate_limit("strict"),
                    "should not specify strict when unlimited",
                );
            }
            if rl.exact {
                self.error_at(
                    &in_rate_limit("exact"),
                    format!("exact cannot be used with unlimited: '{composite}'"),
                );
            }
        } else {
            let primary = LimitConfig {
                unit: rl.unit.clone(),
                requests_per_unit: rl.requests_per_unit,
                unit_multiplier: rl.unit_multiplier,
                algorithm: rl.algorithm.clone(),
                burst: rl.burst,
                strict: rl.strict,
            };
            let at_primary = [Step::Key("rate_limit")];
            if let Some(spec) = self.limit(&primary, composite, &at_primary) {
                limits.push(spec);
            }
            for (j, l) in d.additional_limits.iter().enumerate() {
                let at = [Step::Key("additional_limits"), Step::Index(j)];
                if let Some(spec) = self.limit(l, composite, &at) {
                    limits.push(spec);
                }
            }
        }
        // Exact rules count a request all or nothing, admitted hits only (docs/global.md, "Exact
        // rules"); a `strict: true` there would promise what they do not do.
        let strict_said = std::iter::once(rl.strict)
            .chain(d.additional_limits.iter().map(|l| l.strict))
            .any(|s| s == Some(true));
        if rl.exact && strict_said {
            self.error_at(
                &in_rate_limit("exact"),
                format!(
                    "strict cannot be used with exact (exact rules count admitted hits only): '{composite}'"
                ),
            );
        }
        for (k, r) in rl.replaces.iter().enumerate() {
            let at = [
                Step::Key("rate_limit"),
                Step::Key("replaces"),
                Step::Index(k),
            ];
            if r.name.is_empty() {
                self.error_at(&at, "should not have an empty replaces entry");
            } else if r.name == rl.name {
                self.error_at(&at, "replaces should not contain name of same descriptor");
            }
        }
        let plain: Vec<Limit> = limits.iter().map(|l| l.limit).collect();
        self.rules.push(Rule {
            id: rule_id(composite, rl.unlimited, &plain),
            domain: self.domain.to_string(),
            full_key: composite.to_string(),
            name: rl.name.clone(),
            limits,
            unlimited: rl.unlimited,
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            value_to_metric,
            replaces: rl.replaces.iter().map(|r| r.name.clone()).collect(),
            exact: rl.exact,
            metadata: d.metadata.clone().map(std::sync::Arc::new),
        });
        Some(self.rules.len() - 1)
    }

    /// One limit, written at `at` below the current descriptor (`rate_limit`, or an entry of
    /// `additional_limits`).
    fn limit(&mut self, l: &LimitConfig, composite: &str, at: &[Step]) -> Option<LimitSpec> {
        let key = |k: &str| {
            let mut steps = at.to_vec();
            steps.push(Step::KeyItself(k.to_string()));
            steps
        };
        let unit = Unit::parse(&l.unit);
        if unit.is_none() {
            self.error_at(
                &key("unit"),
                format!(
                    "invalid rate limit unit '{}' (valid: {})",
                    l.unit,
                    Unit::VALID.join(", ")
                ),
            );
        }
        // The reference reads a missing count as 0, a limit that denies every request: a
        // slip (a key one level too far out, a typo), never what was meant. An explicit 0
        // still says "deny everything".
        if l.requests_per_unit.is_none() {
            let (block, whole) = match at {
                [Step::Key("rate_limit")] => {
                    ("rate_limit", vec![Step::KeyItself("rate_limit".into())])
                }
                _ => ("additional_limits entry", at.to_vec()),
            };
            self.error_at(
                &whole,
                format!(
                    "{block} of '{composite}' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request)"
                ),
            );
        }
        let (Some(unit), Some(requests_per_unit)) = (unit, l.requests_per_unit) else {
            return None;
        };
        let multiplier = l.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            self.error_at(
                &key("unit_multiplier"),
                "unit_multiplier must be at least 1",
            );
            return None;
        }
        let window_ms = (unit.seconds() * 1000)
            .checked_mul(u64::from(multiplier))
            .filter(|ms| *ms <= MAX_WINDOW_MS);
        let Some(window_ms) = window_ms else {
            self.error_at(
                &key("unit_multiplier"),
                format!(
                    "{composite}: window of {multiplier} {}s is too long (at most {} days, 10 years)",
                    unit.name().to_ascii_lowercase(),
                    MAX_WINDOW_MS / 86_400_000,
                ),
            );
            return None;
        };
        let algorithm = match l.algorithm.as_deref() {
            None | Some("sliding_window") => Algorithm::SlidingWindow,
            Some("fixed_window") => Algorithm::FixedWindow,
            Some("token_bucket") => Algorithm::TokenBucket {
                burst: l.burst.unwrap_or(requests_per_unit),
            },
            Some(other) => {
                self.error_at(
                    &key("algorithm"),
                    format!(
                        "invalid algorithm '{other}' (expected sliding_window, fixed_window or token_bucket)"
                    ),
                );
                return None;
            }
        };
        let bucket = matches!(algorithm, Algorithm::TokenBucket { .. });
        if l.burst.is_some() && !bucket {
            self.error_at(
                &key("burst"),
                format!("{composite}: burst needs algorithm: token_bucket"),
            );
            return None;
        }
        // A token takes at least a nanosecond to refill (`core/bucket.rs`).
        if bucket && u64::from(requests_per_unit) * 1000 > window_ms * MAX_BUCKET_RATE {
            self.error_at(
                &key("requests_per_unit"),
                format!(
                    "{composite}: a token bucket refills at most {MAX_BUCKET_RATE} tokens a second"
                ),
            );
            return None;
        }
        Some(LimitSpec {
            limit: Limit {
                requests_per_unit,
                window_ms,
                algorithm,
            },
            unit,
            // Buckets are lenient unless told: a denied request takes no token.
            strict: l.strict.unwrap_or(!bucket),
        })
    }
}

/// The fastest refill a token bucket may have, per second: one token per nanosecond.
const MAX_BUCKET_RATE: u64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::parse;

    fn set(yaml: &str) -> RuleSet {
        RuleSet::compile(&[("t.yaml".into(), parse("t.yaml", yaml).unwrap())], false).unwrap()
    }

    #[test]
    fn every_error_is_reported() {
        let f = parse("e.yaml", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: a\n  - value: x\n  - key: b\n    rate_limit: {unit: second, unlimited: true}\n").unwrap();
        let errs = RuleSet::compile(&[("e.yaml".into(), f)], false).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "e.yaml: invalid rate limit unit 'fortnight' (valid: second, minute, hour, day, week, month, year) (domain 'd', descriptor path 'a')",
                "e.yaml: duplicate descriptor composite key 'd.a' (domain 'd', descriptor path 'a')",
                "e.yaml: descriptor has empty key (domain 'd', descriptor path '_x')",
                "e.yaml: should not specify rate limit unit when unlimited (domain 'd', descriptor path 'b')",
            ]
        );
    }

    /// Every error of compiling `yaml` as `edge.yaml`, as printed.
    fn errors(yaml: &str) -> Vec<String> {
        compile_sources(&[("edge.yaml".into(), yaml.into())], false)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn requests_per_unit_one_level_too_far_out_is_caught_with_its_line() {
        // Issue 19, item 10: this passed `check` and became a limit of 0 (every request
        // denied): the count sat beside `rate_limit:`, where the reference ignores it.
        let yaml = "domain: edge\ndescriptors:\n  - key: remote_address\n    descriptors:\n      - key: path\n        value: /api\n        rate_limit:\n          unit: minute\n        requests_per_unit: 100\n";
        assert_eq!(
            errors(yaml),
            [
                "edge.yaml: config error, misplaced key 'requests_per_unit': it belongs inside 'rate_limit', one level further in (line 9, column 9; domain 'edge', descriptor path 'remote_address' > 'path_/api')",
                "edge.yaml: rate_limit of 'edge.remote_address.path_/api' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request) (line 7, column 9; domain 'edge', descriptor path 'remote_address' > 'path_/api')",
            ]
        );
        // `unit` out too: both named, each on its own line.
        let yaml = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n    unit: minute\n    requests_per_unit: 100\n";
        let errs = errors(yaml);
        assert!(
            errs[0].starts_with(
                "edge.yaml: config error, misplaced key 'unit': it belongs inside 'rate_limit'"
            ) && errs[0]
                .contains("(line 5, column 5; domain 'edge', descriptor path 'remote_address')"),
            "{errs:#?}"
        );
        assert!(
            errs[1].contains("misplaced key 'requests_per_unit'")
                && errs[1].contains("(line 6, column 5;"),
            "{errs:#?}"
        );
    }

    #[test]
    fn algorithm_beside_key_is_named_not_burst() {
        // Issue 19, item 10: the misplaced `algorithm` was ignored and `check` blamed `burst`.
        let yaml = "domain: edge\ndescriptors:\n  - key: user\n    algorithm: token_bucket\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      burst: 30\n";
        let errs = errors(yaml);
        assert_eq!(
            errs[0],
            "edge.yaml: config error, misplaced key 'algorithm': it belongs inside 'rate_limit', one level further in (line 4, column 5; domain 'edge', descriptor path 'user')"
        );
        // The consequence is still reported, after the cause and at its own line.
        assert_eq!(
            errs[1..],
            ["edge.yaml: edge.user: burst needs algorithm: token_bucket (line 8, column 7; domain 'edge', descriptor path 'user')"]
        );
    }

    #[test]
    fn a_rate_limit_needs_requests_per_unit_unless_unlimited() {
        let yaml = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5}\n    additional_limits:\n      - {unit: day}\n";
        assert_eq!(
            errors(yaml),
            [
                "edge.yaml: rate_limit of 'edge.a' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request) (line 4, column 5; domain 'edge', descriptor path 'a')",
                "edge.yaml: additional_limits entry of 'edge.b' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request) (line 9, column 9; domain 'edge', descriptor path 'b')",
            ]
        );
        // Unlimited needs none; an explicit 0 is accepted (it denies every request), as the
        // reference accepts it.
        let s = set("domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unlimited: true}\n  - key: z\n    rate_limit: {unit: second, requests_per_unit: 0}\n");
        assert!(s.rules()[0].unlimited);
        assert_eq!(s.rules()[1].limits[0].limit.requests_per_unit, 0);
    }

    #[test]
    fn a_bad_unit_lists_the_valid_ones_at_its_line() {
        let yaml = "domain: edge\ndescriptors:\n  - key: remote_address\n    descriptors:\n      - key: path\n        value: /api\n        rate_limit:\n          unit: minutes\n          requests_per_unit: 100\n";
        assert_eq!(
            errors(yaml),
            ["edge.yaml: invalid rate limit unit 'minutes' (valid: second, minute, hour, day, week, month, year) (line 8, column 11; domain 'edge', descriptor path 'remote_address' > 'path_/api')"]
        );
    }

    #[test]
    fn sluices_keys_out_of_place_are_errors_the_references_are_ignored_as_it_does() {
        // `shadow_mode` inside `rate_limit`, `unit` in a `replaces` entry and at the top: the
        // reference loads such files and ignores those keys, so sluice does too (a drop-in);
        // sluice's own `exact` in an `additional_limits` entry would change what is counted.
        let yaml = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      shadow_mode: true\n    additional_limits:\n      - {unit: day, requests_per_unit: 9, exact: true}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x, unit: day}]}\nunit: second\n";
        assert_eq!(
            errors(yaml),
            [
                "edge.yaml: config error, misplaced key 'exact': it applies to the whole rule: it belongs inside 'rate_limit' (line 9, column 43; domain 'edge', descriptor path 'a')",
            ]
        );
    }

    #[test]
    fn errors_without_a_text_keep_their_place() {
        // Rules that come without a text (xDS) have no lines, but still name the rule.
        let f = RulesFile {
            domain: "d".into(),
            descriptors: vec![DescriptorConfig {
                key: "k".into(),
                rate_limit: Some(model::RateLimitConfig {
                    unit: "fortnight".into(),
                    requests_per_unit: Some(1),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        let errs = RuleSet::compile(&[("xds:n".into(), f)], false).unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "xds:n: invalid rate limit unit 'fortnight' (valid: second, minute, hour, day, week, month, year) (domain 'd', descriptor path 'k')"
        );
    }

    #[test]
    fn custom_windows_and_several_limits() {
        let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 30, requests_per_unit: 5, algorithm: fixed_window}\n    additional_limits:\n      - {unit: day, requests_per_unit: 100}\n");
        let r = &s.rules()[0];
        assert_eq!(r.limits.len(), 2);
        assert_eq!(r.limits[0].limit.window_ms, 30 * 60_000);
        assert_eq!(r.limits[0].limit.algorithm, Algorithm::FixedWindow);
        assert_eq!(r.limits[1].limit.window_ms, 86_400_000);
        assert!(s.dump().contains("unit_multiplier=30"));
    }

    #[test]
    fn strict_is_per_limit_defaults_on_and_is_checked() {
        let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, strict: false}\n    additional_limits:\n      - {unit: day, requests_per_unit: 100}\n      - {unit: hour, requests_per_unit: 50, strict: true}\n");
        let strict: Vec<bool> = s.rules()[0].limits.iter().map(|l| l.strict).collect();
        assert_eq!(strict, [false, true, true]);
        // Not part of the rule id: the same counters, counted another way.
        let y = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
        let off = y.replace("5}", "5, strict: false}");
        assert_eq!(set(y).rules()[0].id, set(&off).rules()[0].id);
        assert!(s
            .dump()
            .contains("requests_per_unit=5 strict=false, unit=DAY"));
        let errs = compile_sources(
            &[("s.yaml".into(), "domain: d\ndescriptors:\n  - key: a\n    strict: false\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unlimited: true, strict: true}\n".into())],
            false,
        )
        .unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "s.yaml: config error, misplaced key 'strict': it belongs inside 'rate_limit' or an 'additional_limits' entry, one level further in (line 4, column 5; domain 'd', descriptor path 'a')",
                "s.yaml: should not specify strict when unlimited (line 7, column 35; domain 'd', descriptor path 'b')",
            ]
        );
        let errs = parse(
            "t.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, strict: sometimes}\n",
        )
        .unwrap_err();
        assert!(
            errs[0].message.contains(
                "rate_limit.strict: invalid type: string \"sometimes\", expected a boolean"
            ),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn windows_past_ten_years_are_rejected_naming_the_rule() {
        let f = parse(
            "w.yaml",
            "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: year, unit_multiplier: 4294967295, requests_per_unit: 1}\n  - key: ok\n    rate_limit: {unit: year, unit_multiplier: 10, requests_per_unit: 1}\n    additional_limits:\n      - {unit: day, unit_multiplier: 3651, requests_per_unit: 1}\n",
        )
        .unwrap();
        let errs = RuleSet::compile(&[("w.yaml".into(), f)], false).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "w.yaml: edge.user: window of 4294967295 years is too long (at most 3650 days, 10 years) (domain 'edge', descriptor path 'user')",
                "w.yaml: edge.ok: window of 3651 days is too long (at most 3650 days, 10 years) (domain 'edge', descriptor path 'ok')",
            ]
        );
        // The bound itself is accepted.
        let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 1}\n");
        assert_eq!(s.rules()[0].limits[0].limit.window_ms, MAX_WINDOW_MS);
    }

    #[test]
    fn exact_is_a_rule_flag_checked_like_the_other_keys() {
        let s = set("domain: d\ndescriptors:\n  - key: login\n    rate_limit: {unit: hour, requests_per_unit: 10, exact: true}\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n");
        assert!(s.rules()[0].exact && !s.rules()[1].exact);
        assert!(s.has_exact());
        assert_eq!(
            s.dump(),
            "d.login: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false, exact: true\n\
             d.k: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false\n"
        );
        // The flag is not part of the rule's identity: turning it on keeps the counters.
        assert_eq!(
            s.rules()[0].id,
            set("domain: d\ndescriptors:\n  - key: login\n    rate_limit: {unit: hour, requests_per_unit: 10}\n").rules()[0].id
        );
        let f = parse(
            "x.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, exact: true}\n",
        )
        .unwrap();
        let errs = RuleSet::compile(&[("x.yaml".into(), f)], false).unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "x.yaml: exact cannot be used with unlimited: 'd.a' (domain 'd', descriptor path 'a')"
        );
        let errs = parse(
            "y.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, exact: maybe}\n",
        )
        .unwrap_err();
        assert!(errs[0].message.contains("rate_limit.exact"), "{}", errs[0]);
        let f = parse(
            "z.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, exact: true, strict: true}\n",
        )
        .unwrap();
        let errs = RuleSet::compile(&[("z.yaml".into(), f)], false).unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "z.yaml: strict cannot be used with exact (exact rules count admitted hits only): 'd.a' (domain 'd', descriptor path 'a')"
        );
    }

    #[test]
    fn token_buckets_parse_with_their_defaults() {
        let s = set("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 30, algorithm: token_bucket, strict: true}\n  - key: w\n    rate_limit: {unit: second, requests_per_unit: 10}\n");
        let [a, b, w] = [0, 1, 2].map(|i| s.rules()[i].limits[0]);
        // burst defaults to requests_per_unit: a bucket of one window's worth.
        assert_eq!(a.limit.algorithm, Algorithm::TokenBucket { burst: 10 });
        assert_eq!(a.limit.window_ms, 1000);
        assert_eq!(b.limit.algorithm, Algorithm::TokenBucket { burst: 30 });
        // strict defaults off for buckets (a denied request takes no token), on for windows
        // (the reference's INCRBY of every hit); either may be stated.
        assert_eq!([a.strict, b.strict, w.strict], [false, true, true]);
        // /rlconfig tells a bucket from a window, and strict only where it is not the
        // algorithm's default.
        assert_eq!(
            s.dump(),
            "d.a: unit=SECOND requests_per_unit=10 algorithm=token_bucket burst=10, shadow_mode: false, quota_mode: false\n\
             d.b: unit=SECOND requests_per_unit=10 algorithm=token_bucket burst=30 strict=true, shadow_mode: false, quota_mode: false\n\
             d.w: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false\n"
        );
        // The burst is part of the counter's identity (`identity.rs`); strict is not.
        let id = |y: &str| set(y).rules()[0].id;
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket";
        assert_eq!(
            id(&format!("{base}}}\n")),
            id(&format!("{base}, burst: 10}}\n"))
        );
        assert_ne!(
            id(&format!("{base}}}\n")),
            id(&format!("{base}, burst: 11}}\n"))
        );
        assert_eq!(
            id(&format!("{base}}}\n")),
            id(&format!("{base}, strict: true}}\n"))
        );
    }

    #[test]
    fn a_bucket_sits_beside_a_window_in_additional_limits() {
        let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    additional_limits:\n      - {unit: second, requests_per_unit: 5, burst: 20, algorithm: token_bucket}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 20, algorithm: token_bucket}\n    additional_limits:\n      - {unit: day, requests_per_unit: 1000, algorithm: fixed_window}\n");
        let k: Vec<(Algorithm, bool)> = s.rules()[0]
            .limits
            .iter()
            .map(|l| (l.limit.algorithm, l.strict))
            .collect();
        assert_eq!(
            k,
            [
                (Algorithm::SlidingWindow, true),
                (Algorithm::TokenBucket { burst: 20 }, false)
            ]
        );
        let j = &s.rules()[1].limits;
        assert_eq!(j[0].limit.algorithm, Algorithm::TokenBucket { burst: 20 });
        assert_eq!(
            (j[1].limit.algorithm, j[1].limit.window_ms, j[1].strict),
            (Algorithm::FixedWindow, 86_400_000, true)
        );
    }

    #[test]
    fn bucket_keys_are_checked() {
        let f = parse(
            "b.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 30}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 30, algorithm: fixed_window}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: foo}\n  - key: e\n    rate_limit: {unit: second, requests_per_unit: 2000000000, algorithm: token_bucket}\n  - key: f\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    additional_limits:\n      - {unit: second, requests_per_unit: 1, burst: 5}\n",
        )
        .unwrap();
        let errs = RuleSet::compile(&[("b.yaml".into(), f)], false).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "b.yaml: d.a: burst needs algorithm: token_bucket (domain 'd', descriptor path 'a')",
                "b.yaml: d.b: burst needs algorithm: token_bucket (domain 'd', descriptor path 'b')",
                "b.yaml: invalid algorithm 'foo' (expected sliding_window, fixed_window or token_bucket) (domain 'd', descriptor path 'c')",
                "b.yaml: d.e: a token bucket refills at most 1000000000 tokens a second (domain 'd', descriptor path 'e')",
                "b.yaml: d.f: burst needs algorithm: token_bucket (domain 'd', descriptor path 'f')",
            ]
        );
        // The fastest refill is accepted: a token a nanosecond (1e9 a second, or 60e9 over a
        // minute would not fit in a u32; 1e9 over a second is the bound itself).
        let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}\n");
        assert_eq!(
            s.rules()[0].limits[0].limit.algorithm,
            Algorithm::TokenBucket {
                burst: 1_000_000_000
            }
        );
        // A burst must be a whole number in u32, as every count.
        let errs = parse(
            "t.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: -1, algorithm: token_bucket}\n",
        )
        .unwrap_err();
        assert!(errs[0].message.contains("rate_limit.burst"), "{}", errs[0]);
    }

    #[test]
    fn wildcards_checked_one_by_one_are_bounded_per_level() {
        let limit = "rate_limit: {unit: second, requests_per_unit: 1}";
        let text = |n: usize| {
            let mut y = String::from(
                "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n",
            );
            // Any number of the indexed shapes, then `n` patterns of the other kind.
            for i in 0..1000 {
                y += &format!("      - {{key: path, value: \"/p{i}/*\", {limit}}}\n");
                y += &format!("      - {{key: path, value: \"*bot{i}*\", {limit}}}\n");
            }
            for i in 0..n {
                y += &format!("      - {{key: path, value: \"/api/*/u{i}/*\", {limit}}}\n");
            }
            vec![("w.yaml".to_string(), y)]
        };
        let s = compile_sources(&text(MAX_WILDCARD_CHECKS), false).unwrap();
        let hit = s
            .find("d", &[("k", "v"), ("path", "/api/x/u63/y")])
            .unwrap();
        assert_eq!(hit.rule.full_key, "d.k_v.path_/api/*/u63/*");
        let errs = compile_sources(&text(MAX_WILDCARD_CHECKS + 1), false).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(ToString::to_string).collect();
        // At the level's last pattern: the 65th of its kind, line 5 + 2,000 + 65.
        assert_eq!(
            msgs,
            vec![
                "w.yaml: the wildcard values of key 'path' need 65 passes over a request value, at most 64 are allowed (each value with a literal between two '*' other than '*text*' takes one, and so does each nested prefix of 'prefix*suffix' values) (line 2070, column 21; domain 'd', descriptor path 'k_v' > 'path_/api/*/u64/*')"
            ]
        );
        // Nested prefixes of `prefix*suffix` values count one each, side by side ones do not.
        let values = |n: usize, value: fn(usize) -> String| {
            let mut y = String::from("domain: d\ndescriptors:\n");
            for i in 0..n {
                y += &format!("  - {{key: path, value: \"{}\", {limit}}}\n", value(i));
            }
            RuleSet::compile(&[("c.yaml".into(), parse("c.yaml", &y).unwrap())], false)
        };
        let nested = |i| format!("/{}*.json", "a".repeat(i));
        assert!(values(MAX_WILDCARD_CHECKS, nested).is_ok());
        assert!(values(MAX_WILDCARD_CHECKS + 1, nested).is_err());
        assert!(values(5000, |i| format!("/{i}/*.json")).is_ok());
        // Duplicates among thousands are still found (by hash, then compared).
        let errs = values(5000, |i| format!("/{}/*.json", i % 4999)).unwrap_err();
        assert_eq!(
            errs[0].to_string(),
            "c.yaml: duplicate descriptor composite key 'd.path_/0/*.json' (domain 'd', descriptor path 'path_/0/*.json')"
        );
    }
}
