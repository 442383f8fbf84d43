//! Validation and compilation of parsed rules files into a [`RuleSet`]: every error of every
//! file is collected (the reference's wording), and nothing is compiled when there is one.
//!
//! This file walks the descriptor tree (domains, duplicates, wildcard bounds); `rule.rs`
//! compiles a descriptor's `rate_limit` into a rule, `limit.rs` each of its limits,
//! `overrides.rs` its `overrides` into a rule per value.

use std::collections::HashMap;

use super::error::{self, place, ConfigError};
use super::locate::Step;
use super::model::{self, DescriptorConfig, RulesFile};
use super::tree::{KeyLevel, Kind, Map, Node, MAX_WILDCARD_CHECKS};
use super::{Rule, RuleSet};
use crate::core::Algorithm;

pub use overrides::{MAX_OVERRIDES, MAX_OVERRIDES_PER_RULE};

/// The settings that change what a rules file means; the default is the reference's
/// reading, but for sluice's sliding windows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// `MERGE_DOMAIN_CONFIG`: files that share a domain are merged; otherwise a domain may
    /// appear in one file only.
    pub merge_domains: bool,
    /// `DEFAULT_ALGORITHM`: the algorithm of a limit that names none (sliding window, or
    /// the reference's fixed window).
    pub default_algorithm: Algorithm,
}

impl RuleSet {
    /// [`RuleSet::compile_with`] the default options, but `merge_domains`.
    ///
    /// # Errors
    /// Every problem found in every file; nothing is compiled when there is one.
    pub fn compile(
        files: &[(String, RulesFile)],
        merge_domains: bool,
    ) -> Result<RuleSet, Vec<ConfigError>> {
        let options = CompileOptions {
            merge_domains,
            ..CompileOptions::default()
        };
        Self::compile_with(files, options)
    }

    /// Validates and compiles parsed files (name, content), as `options` say.
    ///
    /// # Errors
    /// Every problem found in every file; nothing is compiled when there is one.
    pub fn compile_with(
        files: &[(String, RulesFile)],
        options: CompileOptions,
    ) -> Result<RuleSet, Vec<ConfigError>> {
        let mut set = RuleSet::default();
        let mut errors = Vec::new();
        let mut override_count = 0;
        for (name, file) in files {
            let at_domain = vec![Step::KeyItself("domain".into())];
            if file.domain.is_empty() {
                errors.push(
                    ConfigError::new(name, "config file cannot have empty domain")
                        .at(at_domain, None),
                );
                continue;
            }
            if set.domains.contains_key(&file.domain) && !options.merge_domains {
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
                source: std::sync::Arc::from(name.as_str()),
                domain: &file.domain,
                rules: &mut set.rules,
                origins: &mut set.origins,
                errors: &mut errors,
                override_count: &mut override_count,
                default_algorithm: options.default_algorithm,
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

/// [`compile_sources_with`] the default options, but `merge_domains`.
///
/// # Errors
/// Every problem found; nothing is compiled when there is one.
pub fn compile_sources(
    sources: &[(String, String)],
    merge_domains: bool,
) -> Result<RuleSet, Vec<ConfigError>> {
    let options = CompileOptions {
        merge_domains,
        ..CompileOptions::default()
    };
    compile_sources_with(sources, options)
}

/// Parses and compiles rules sources given as (name, text), as `options` say, reporting
/// every error of every file at once: key, syntax and type problems and semantic ones alike,
/// each with its line and column in the file where they can be found (`error.rs`,
/// `locate.rs`). The set keeps the files' warnings, located the same way.
///
/// # Errors
/// Every problem found; nothing is compiled when there is one.
pub fn compile_sources_with(
    sources: &[(String, String)],
    options: CompileOptions,
) -> Result<RuleSet, Vec<ConfigError>> {
    let mut parsed = Vec::new();
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    for (name, text) in sources {
        let mut p = model::parse_lenient(name, text);
        errors.append(&mut p.errors);
        warnings.append(&mut p.warnings);
        if let Some(f) = p.file {
            parsed.push((name.clone(), f));
        }
    }
    let mut result = with_prior_errors(errors, RuleSet::compile_with(&parsed, options));
    let located = match &mut result {
        Ok(set) => {
            set.keep_texts(sources);
            set.warnings = warnings;
            &mut set.warnings
        }
        Err(errors) => errors,
    };
    for (name, text) in sources {
        error::resolve(located, name, text);
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

struct Compiler<'a> {
    file: &'a str,
    /// `file`, shared by the origins of its rules.
    source: std::sync::Arc<str>,
    domain: &'a str,
    rules: &'a mut Vec<Rule>,
    /// Where each rule was written, pushed with it.
    origins: &'a mut Vec<super::origin::Origin>,
    errors: &'a mut Vec<ConfigError>,
    /// The overrides of every file so far, for their bound across files.
    override_count: &'a mut usize,
    /// The algorithm of a limit that names none.
    default_algorithm: Algorithm,
    /// The steps from the top of the file to the descriptor being compiled (to the
    /// `descriptors` list being walked, between descriptors).
    node: Vec<Step>,
    /// The `key`/`key_value` of each descriptor from the domain down to the current one.
    path: Vec<String>,
}

impl Compiler<'_> {
    /// Records where the rule just pushed was written: the node `steps` below the current
    /// descriptor.
    fn record_origin(&mut self, steps: &[Step]) {
        let node = self.node.iter().chain(steps).cloned().collect();
        self.origins.push(super::origin::Origin {
            file: self.source.clone(),
            node,
        });
    }

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
        level: &mut Map<KeyLevel>,
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
        level: &mut Map<KeyLevel>,
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
            // An override is its value's rule: the same composite key.
            Kind::Exact => {
                key_level.exact.contains_key(&d.value) || key_level.overrides.contains_key(&d.value)
            }
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
        let overrides = self.overrides(d, kind, rule, parent_key, &level[&d.key]);
        let mut node = Node {
            kind,
            final_key,
            rule,
            share_threshold: d.share_threshold,
            value_to_metric: d.value_to_metric,
            children: Map::default(),
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
        key_level.overrides.extend(overrides);
        match kind {
            Kind::AnyValue => key_level.any_value = Some(Box::new(node)),
            Kind::Wildcard => key_level.push_wildcard(d.value.clone(), node),
            Kind::Exact => {
                key_level.exact.insert(d.value.clone(), node);
            }
        }
    }
}

mod limit;
mod overrides;
mod rule;

#[cfg(test)]
mod reading_tests;
#[cfg(test)]
mod tests;
