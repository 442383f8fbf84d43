//! Tests of compiling `overrides`: each value's rule is the rule of a descriptor for that value
//! alone, every error is reported with its line, and both bounds are crossed.

use super::*;
use crate::core::Algorithm;
use crate::rules::compile::compile_sources;
use crate::rules::{RuleSet, Unit};

/// Every error of compiling the files (name, text), as printed.
fn errors(files: &[(&str, &str)]) -> Vec<String> {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    compile_sources(&sources, false)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn set(yaml: &str) -> RuleSet {
    compile_sources(&[("t.yaml".into(), yaml.into())], false).unwrap()
}

/// The rule of `full_key` in `s`.
fn rule<'s>(s: &'s RuleSet, full_key: &str) -> &'s Rule {
    s.rules()
        .iter()
        .find(|r| r.full_key == full_key)
        .unwrap_or_else(|| panic!("no rule {full_key} in {}", s.dump()))
}

#[test]
fn an_override_compiles_to_the_rule_of_a_descriptor_for_its_value() {
    let base = "    shadow_mode: true\n    detailed_metric: true\n    metadata: {team: a}\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 30, strict: true, name: n, replaces: [{name: m}]}\n    additional_limits:\n      - {unit: day, requests_per_unit: 100}\n";
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: tenant\n{base}    overrides:\n      acme: 50\n      7: {{unit: second, requests_per_unit: 5, unit_multiplier: 2}}\n"
    ));
    // The same limits written as descriptors for one value each.
    let expanded = set(&format!(
        "domain: d\ndescriptors:\n  - key: tenant\n{base}  - key: tenant\n    value: acme\n{}  - key: tenant\n    value: \"7\"\n{}",
        base.replace("requests_per_unit: 10,", "requests_per_unit: 50,"),
        base.replace(
            "unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 30, strict: true,",
            "unit: second, requests_per_unit: 5, unit_multiplier: 2,"
        ),
    ));
    // The same but for knowing whose override it is (for METRICS_OVERRIDE_SERIES).
    assert_eq!(rule(&s, "d.tenant"), rule(&expanded, "d.tenant"));
    for key in ["d.tenant_acme", "d.tenant_7"] {
        let o = rule(&s, key);
        assert_eq!(o.override_of.as_deref(), Some("d.tenant"));
        let o = Rule {
            override_of: None,
            ..o.clone()
        };
        assert_eq!(&o, rule(&expanded, key), "{key}");
    }
    // A count keeps the rest of the rule's limit (burst and strict as written); a whole
    // limit replaces it, and the rule's additional limits stay.
    let acme = &rule(&s, "d.tenant_acme").limits;
    assert_eq!(acme[0].limit.requests_per_unit, 50);
    assert_eq!(
        acme[0].limit.algorithm,
        Algorithm::TokenBucket { burst: 30 }
    );
    assert!(acme[0].strict);
    let seven = &rule(&s, "d.tenant_7").limits;
    assert_eq!(
        (
            seven[0].unit,
            seven[0].limit.window_ms,
            seven[0].limit.algorithm
        ),
        (Unit::Second, 2000, Algorithm::SlidingWindow)
    );
    assert_eq!(seven[1].unit, Unit::Day);
    // Its own id: a changed override starts fresh counters, as a changed rule does.
    assert_ne!(
        rule(&s, "d.tenant_acme").id,
        set(&format!(
            "domain: d\ndescriptors:\n  - key: tenant\n{base}    overrides:\n      acme: 51\n"
        ))
        .rules()[1]
            .id
    );
}

#[test]
fn every_override_error_is_reported_at_its_line() {
    let limit = "rate_limit: {unit: second, requests_per_unit: 1}";
    let yaml = format!(
        "domain: d\ndescriptors:
  - key: a
    value: x
    {limit}
    overrides: {{y: 1}}
  - key: b
    overrides: {{y: 1}}
  - key: c
    rate_limit: {{unlimited: true}}
    overrides: {{y: 1}}
  - key: t
    value: \"acme-*\"
    {limit}
    overrides:
      \"\": 1
      acme-*1: 1
      beta: 1
      acme-1: 1
      acme-2: {{unit: fortnight, requests_per_unit: 1}}
      acme-3: {{unit: second}}
      acme-4: {{unit: second, requests_per_unit: 1, shadow_mode: true}}
      acme-5: {{unit: second, requests_per_unit: 1, algorithm: leaky}}
  - key: t
    {limit}
    overrides:
      7: 1
      \"7\": 2
      exact: 1
      acme-1: 1
  - key: t
    value: exact
    {limit}
  - key: t
    value: \"7\"
    {limit}
  - key: bucket
    rate_limit: {{unit: second, requests_per_unit: 1, algorithm: token_bucket, exact: true}}
    overrides:
      fast: 2000000000
      strict: {{unit: second, requests_per_unit: 1, strict: true}}
"
    );
    assert_eq!(
        errors(&[("o.yaml", &yaml)]),
        [
            "o.yaml: config error, misplaced key 'shadow_mode': it belongs in the descriptor, beside 'overrides' (line 22, column 52; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: overrides need a key-only or wildcard descriptor, but 'd.a_x' is for the value 'x' alone (drop 'value', or make it a pattern with '*') (line 6, column 5; domain 'd', descriptor path 'a_x')",
            "o.yaml: overrides needs a rate_limit block: 'd.b' (line 8, column 5; domain 'd', descriptor path 'b')",
            "o.yaml: overrides cannot be used with unlimited: 'd.c' (line 11, column 5; domain 'd', descriptor path 'c')",
            "o.yaml: an override needs a value, not an empty one: 'd.t_acme-*' (line 16, column 7; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: override value 'acme-*1' contains '*': an override is for one value, not a pattern: 'd.t_acme-*' (line 17, column 7; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: override value 'beta' does not match 'acme-*', so it would never apply: 'd.t_acme-*' (line 18, column 7; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: invalid rate limit unit 'fortnight' (valid: second, minute, hour, day, week, month, year) (line 20, column 16; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: override of 'd.t_acme-3' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request) (line 21, column 15; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: invalid algorithm 'leaky' (expected sliding_window, fixed_window, token_bucket or concurrency) (line 23, column 52; domain 'd', descriptor path 't_acme-*')",
            "o.yaml: duplicate override value '7' in 'd.t' (line 28, column 7; domain 'd', descriptor path 't')",
            "o.yaml: duplicate descriptor composite key 'd.t_acme-1' (another descriptor of key 't' names the value too) (line 30, column 7; domain 'd', descriptor path 't')",
            "o.yaml: duplicate descriptor composite key 'd.t_exact' (line 31, column 5; domain 'd', descriptor path 't_exact')",
            "o.yaml: duplicate descriptor composite key 'd.t_7' (line 34, column 5; domain 'd', descriptor path 't_7')",
            "o.yaml: d.bucket_fast: a token bucket refills at most 1000000000 tokens a second (line 40, column 13; domain 'd', descriptor path 'bucket')",
            "o.yaml: strict cannot be used with exact (exact rules count admitted hits only): 'd.bucket_strict' (line 41, column 52; domain 'd', descriptor path 'bucket')",
        ]
    );
}

#[test]
fn a_rule_past_its_bound_of_overrides_is_refused() {
    // The bound itself is allowed: `the_rules_past_the_bound_of_overrides_in_all_are_refused`.
    let n = MAX_OVERRIDES_PER_RULE + 1;
    let mut yaml = String::from("domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: second, requests_per_unit: 1}\n    overrides: {");
    for i in 0..n {
        yaml += &format!("v{i}: {i},");
    }
    yaml += "}\n";
    assert_eq!(
        errors(&[("big.yaml", &yaml)]),
        [format!("big.yaml: 'd.t' has {n} overrides, at most {MAX_OVERRIDES_PER_RULE} are allowed per rule (line 5, column 5; domain 'd', descriptor path 't')")]
    );
}

#[test]
fn the_rules_past_the_bound_of_overrides_in_all_are_refused() {
    // Files of a rule with as many overrides as a rule may have, up to the bound in all,
    // then one more: the error names the rule that crosses the bound, once (the rule after
    // it is not compiled), so every file before it is within both bounds.
    let file = |domain: usize, n: usize| {
        let mut y = format!("domain: d{domain}\ndescriptors:\n  - key: t\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n    overrides: {{");
        for i in 0..n {
            y += &format!("v{i}: 1,");
        }
        y + "}\n"
    };
    let full = MAX_OVERRIDES / MAX_OVERRIDES_PER_RULE;
    let mut files: Vec<(String, String)> = (0..full)
        .map(|i| (format!("{i}.yaml"), file(i, MAX_OVERRIDES_PER_RULE)))
        .collect();
    let last = file(full, 1) + "  - key: u\n    rate_limit: {unit: second, requests_per_unit: 1}\n    overrides: {w: 1}\n";
    files.push(("last.yaml".into(), last));
    let names: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        errors(&names),
        [format!("last.yaml: the rules have more than {MAX_OVERRIDES} overrides in all ('d{full}.t' brings them to {}) (line 5, column 5; domain 'd{full}', descriptor path 't')", MAX_OVERRIDES + 1)]
    );
}

#[test]
fn an_override_to_a_concurrency_limit_beside_other_limits_is_refused() {
    // A release gives back to every limit of its rule: as for a rule's own limits.
    let yaml = "domain: d\ndescriptors:
  - key: t
    rate_limit: {unit: second, requests_per_unit: 1}
    additional_limits: [{unit: minute, requests_per_unit: 10}]
    overrides:
      a: {unit: minute, requests_per_unit: 4, algorithm: concurrency}
      b: 5
";
    assert_eq!(
        errors(&[("c.yaml", yaml)]),
        ["c.yaml: algorithm: concurrency cannot be combined with other limits in one rule (a release gives back to every limit of it): 'd.t_a' (line 7, column 10; domain 'd', descriptor path 't')"]
    );
}
