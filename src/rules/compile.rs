//! Validation and compilation of parsed rules files into a [`RuleSet`]: every error of every
//! file is collected (the reference's wording), and nothing is compiled when there is one.

use std::collections::HashMap;

use super::identity::rule_id;
use super::model::{self, ConfigError, DescriptorConfig, LimitConfig, RulesFile};
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
            if file.domain.is_empty() {
                errors.push(ConfigError::new(
                    name,
                    "config file cannot have empty domain",
                ));
                continue;
            }
            if set.domains.contains_key(&file.domain) && !merge_domains {
                errors.push(ConfigError::new(
                    name,
                    format!("duplicate domain '{}' in config file", file.domain),
                ));
                continue;
            }
            let mut root = set.domains.remove(&file.domain).unwrap_or_default();
            let mut cx = Compiler {
                file: name,
                domain: &file.domain,
                rules: &mut set.rules,
                errors: &mut errors,
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
/// file at once: key, syntax and type problems and semantic ones alike.
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
    with_prior_errors(errors, RuleSet::compile(&parsed, merge_domains))
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
}

impl Compiler<'_> {
    fn error(&mut self, message: impl Into<String>) {
        self.errors.push(ConfigError::new(self.file, message));
    }

    fn load(
        &mut self,
        level: &mut HashMap<String, KeyLevel>,
        parent_key: &str,
        descriptors: &[DescriptorConfig],
        inherited_value_to_metric: bool,
    ) {
        for d in descriptors {
            if d.key.is_empty() {
                self.error("descriptor has empty key");
                continue;
            }
            let final_key = if d.value.is_empty() {
                d.key.clone()
            } else {
                format!("{}_{}", d.key, d.value)
            };
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
                continue;
            }
            if d.strict.is_some() {
                self.error(format!(
                    "strict belongs in rate_limit or an additional_limits entry: '{composite}'"
                ));
            }
            if d.share_threshold && kind != Kind::Wildcard {
                self.error(format!(
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
            self.load(
                &mut node.children,
                &format!("{composite}."),
                &d.descriptors,
                value_to_metric,
            );
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
        // Only the levels that got patterns from this batch: a level merged from an earlier
        // file is indexed (and its bound reported) once per file that adds to it.
        let mut with_wildcards: Vec<&str> = descriptors
            .iter()
            .filter(|d| d.value.contains('*'))
            .map(|d| d.key.as_str())
            .collect();
        with_wildcards.sort_unstable();
        with_wildcards.dedup();
        for key in with_wildcards {
            let Some(key_level) = level.get_mut(key) else {
                continue;
            };
            let checks = key_level.index_wildcards();
            if checks > MAX_WILDCARD_CHECKS {
                self.error(format!(
                    "{parent_key}{key}: the wildcard values of key '{key}' need {checks} passes over a request value, at most {MAX_WILDCARD_CHECKS} are allowed (each value with a literal between two '*' other than '*text*' takes one, and so does each nested prefix of 'prefix*suffix' values)"
                ));
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
                self.error(format!(
                    "additional_limits needs a rate_limit block: '{composite}'"
                ));
            }
            return None;
        };
        let unit = Unit::parse(&rl.unit);
        let mut limits = Vec::new();
        if rl.unlimited {
            if unit.is_some() {
                self.error("should not specify rate limit unit when unlimited");
            }
            if !d.additional_limits.is_empty() {
                self.error(format!(
                    "additional_limits cannot be used with unlimited: '{composite}'"
                ));
            }
            if rl.strict.is_some() {
                self.error("should not specify strict when unlimited");
            }
            if rl.exact {
                self.error(format!(
                    "exact cannot be used with unlimited: '{composite}'"
                ));
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
            for l in std::iter::once(&primary).chain(&d.additional_limits) {
                if let Some(spec) = self.limit(l, composite) {
                    limits.push(spec);
                }
            }
        }
        // Exact rules count a request all or nothing, admitted hits only (README, "Exact
        // rules"); a `strict: true` there would promise what they do not do.
        let strict_said = std::iter::once(rl.strict)
            .chain(d.additional_limits.iter().map(|l| l.strict))
            .any(|s| s == Some(true));
        if rl.exact && strict_said {
            self.error(format!(
                "strict cannot be used with exact (exact rules count admitted hits only): '{composite}'"
            ));
        }
        for r in &rl.replaces {
            if r.name.is_empty() {
                self.error("should not have an empty replaces entry");
            } else if r.name == rl.name {
                self.error("replaces should not contain name of same descriptor");
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

    fn limit(&mut self, l: &LimitConfig, composite: &str) -> Option<LimitSpec> {
        let Some(unit) = Unit::parse(&l.unit) else {
            self.error(format!("invalid rate limit unit '{}'", l.unit));
            return None;
        };
        let multiplier = l.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            self.error("unit_multiplier must be at least 1");
            return None;
        }
        let window_ms = (unit.seconds() * 1000)
            .checked_mul(u64::from(multiplier))
            .filter(|ms| *ms <= MAX_WINDOW_MS);
        let Some(window_ms) = window_ms else {
            self.error(format!(
                "{composite}: window of {multiplier} {}s is too long (at most {} days, 10 years)",
                unit.name().to_ascii_lowercase(),
                MAX_WINDOW_MS / 86_400_000,
            ));
            return None;
        };
        let algorithm = match l.algorithm.as_deref() {
            None | Some("sliding_window") => Algorithm::SlidingWindow,
            Some("fixed_window") => Algorithm::FixedWindow,
            Some("token_bucket") => Algorithm::TokenBucket {
                burst: l.burst.unwrap_or(l.requests_per_unit),
            },
            Some(other) => {
                self.error(format!(
                    "invalid algorithm '{other}' (expected sliding_window, fixed_window or token_bucket)"
                ));
                return None;
            }
        };
        let bucket = matches!(algorithm, Algorithm::TokenBucket { .. });
        if l.burst.is_some() && !bucket {
            self.error(format!("{composite}: burst needs algorithm: token_bucket"));
            return None;
        }
        // A token takes at least a nanosecond to refill (`core/bucket.rs`).
        if bucket && u64::from(l.requests_per_unit) * 1000 > window_ms * MAX_BUCKET_RATE {
            self.error(format!(
                "{composite}: a token bucket refills at most {MAX_BUCKET_RATE} tokens a second"
            ));
            return None;
        }
        Some(LimitSpec {
            limit: Limit {
                requests_per_unit: l.requests_per_unit,
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
                "e.yaml: invalid rate limit unit 'fortnight'",
                "e.yaml: duplicate descriptor composite key 'd.a'",
                "e.yaml: descriptor has empty key",
                "e.yaml: should not specify rate limit unit when unlimited",
            ]
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
        let f = parse(
            "s.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    strict: false\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unlimited: true, strict: true}\n",
        )
        .unwrap();
        let errs = RuleSet::compile(&[("s.yaml".into(), f)], false).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            msgs,
            vec![
                "s.yaml: strict belongs in rate_limit or an additional_limits entry: 'd.a'",
                "s.yaml: should not specify strict when unlimited",
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
                "w.yaml: edge.user: window of 4294967295 years is too long (at most 3650 days, 10 years)",
                "w.yaml: edge.ok: window of 3651 days is too long (at most 3650 days, 10 years)",
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
            "x.yaml: exact cannot be used with unlimited: 'd.a'"
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
            "z.yaml: strict cannot be used with exact (exact rules count admitted hits only): 'd.a'"
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
                "b.yaml: d.a: burst needs algorithm: token_bucket",
                "b.yaml: d.b: burst needs algorithm: token_bucket",
                "b.yaml: invalid algorithm 'foo' (expected sliding_window, fixed_window or token_bucket)",
                "b.yaml: d.e: a token bucket refills at most 1000000000 tokens a second",
                "b.yaml: d.f: burst needs algorithm: token_bucket",
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
        let file = |n: usize| {
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
            parse("w.yaml", &y).unwrap()
        };
        let s = RuleSet::compile(&[("w.yaml".into(), file(MAX_WILDCARD_CHECKS))], false).unwrap();
        let hit = s
            .find("d", &[("k", "v"), ("path", "/api/x/u63/y")])
            .unwrap();
        assert_eq!(hit.rule.full_key, "d.k_v.path_/api/*/u63/*");
        let errs = RuleSet::compile(&[("w.yaml".into(), file(MAX_WILDCARD_CHECKS + 1))], false)
            .unwrap_err();
        let msgs: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            vec![
                "w.yaml: d.k_v.path: the wildcard values of key 'path' need 65 passes over a request value, at most 64 are allowed (each value with a literal between two '*' other than '*text*' takes one, and so does each nested prefix of 'prefix*suffix' values)"
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
            "c.yaml: duplicate descriptor composite key 'd.path_/0/*.json'"
        );
    }
}
