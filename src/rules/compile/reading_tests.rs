//! Tests of reading rules files as envoyproxy/ratelimit reads them, and saying what it
//! lets pass: the first YAML document only, its keys out of place (accepted, with a
//! warning), the hints of YAML and key errors, and the algorithm of limits that name none.

use super::*;
use crate::core::Algorithm;

fn load(yaml: &str) -> Result<RuleSet, Vec<String>> {
    compile_sources(&[("r.yaml".into(), yaml.into())], false)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

fn warnings(set: &RuleSet) -> Vec<String> {
    set.warnings().iter().map(ToString::to_string).collect()
}

const RULE: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

#[test]
fn a_file_of_several_documents_loads_the_first_and_names_the_others() {
    // Ending in `---`: what stopped the start (exit 78) loads, without a word.
    let set = load(&format!("{RULE}---\n")).unwrap();
    assert_eq!(set.rules().len(), 1);
    assert!(set.warnings().is_empty(), "{:?}", warnings(&set));
    // A second domain after `---`: the reference never reads it, and neither does sluice,
    // but it says so, at the line of what is ignored.
    let set = load(&format!("{RULE}---\ndomain: e\n{}", &RULE[10..])).unwrap();
    assert!(set.has_domain("d") && !set.has_domain("e"));
    assert_eq!(
        warnings(&set),
        [
            "r.yaml: only the first YAML document of a file is read, as envoyproxy/ratelimit \
          reads it: this document is ignored; put each domain in a file of its own (line 6, \
          column 1)"
        ]
    );
    // An empty first document is the file, as there: no domain.
    assert_eq!(
        load(&format!("---\n---\n{RULE}")).unwrap_err()[0],
        "r.yaml: config file cannot have empty domain (line 2, column 1)"
    );
}

#[test]
fn a_reference_key_out_of_place_is_accepted_and_ignored_with_a_warning() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      shadow_mode: true\n  - key: n\n    name: quota\n    requests_per_unit: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: open\n    unit: minute\n    requests_per_unit: 5\n";
    let set = load(yaml).unwrap();
    // Accepted as the reference accepts it, and as ignored: the limit is enforced.
    let k = set.find("d", &[("k", "v")]).unwrap().rule;
    assert!(!k.shadow_mode);
    assert_eq!(set.find("d", &[("n", "v")]).unwrap().rule.name, "");
    assert!(set.find("d", &[("open", "v")]).is_none());
    let ignored = "is ignored, as envoyproxy/ratelimit ignores it";
    assert_eq!(
        warnings(&set),
        [
            format!("r.yaml: misplaced key 'shadow_mode' {ignored}: it belongs in the descriptor, beside 'rate_limit', one level further out (line 7, column 7; domain 'd', descriptor path 'k')"),
            format!("r.yaml: misplaced key 'name' {ignored}: it belongs inside 'rate_limit', one level further in (line 9, column 5; domain 'd', descriptor path 'n')"),
            format!("r.yaml: misplaced key 'requests_per_unit' {ignored}: it belongs inside 'rate_limit', one level further in (line 10, column 5; domain 'd', descriptor path 'n')"),
            format!("r.yaml: misplaced key 'unit' {ignored}: it belongs inside 'rate_limit', one level further in (line 13, column 5; domain 'd', descriptor path 'open')"),
            format!("r.yaml: misplaced key 'requests_per_unit' {ignored}: it belongs inside 'rate_limit', one level further in (line 14, column 5; domain 'd', descriptor path 'open')"),
        ]
    );
}

#[test]
fn a_yaml_syntax_slip_is_named_with_its_line_and_likely_cause() {
    let tab = load("domain: d\ndescriptors:\n\t- key: k\n").unwrap_err();
    assert_eq!(
        tab,
        [
            "r.yaml: error loading config file: found character that cannot start any token at \
          line 3 column 1, while scanning for the next token; hint: YAML does not allow tabs \
          for indentation; use spaces"
        ]
    );
    let out_of_step = load("domain: d\ndescriptors:\n  - key: k\n  value: v\n").unwrap_err();
    assert_eq!(
        out_of_step,
        [
            "r.yaml: error loading config file: did not find expected '-' indicator at line 4 \
          column 3, while parsing a block collection at line 3 column 3; hint: check the \
          indentation: the keys of one mapping start in one column (a list entry's keys line \
          up after its '- '), and a value holding ': ' needs quotes"
        ]
    );
}

#[test]
fn an_unknown_key_names_the_known_key_it_likely_misspells() {
    let errors = load("domain: d\ndescriptors:\n  - key: k\n    rate_limt:\n      unit: second\n      requests_per_unt: 1\n      shadowmode: true\n    bogus: 1\n").unwrap_err();
    assert_eq!(
        errors,
        [
            "r.yaml: config error, unknown key 'rate_limt'; did you mean 'rate_limit'? (line 4, column 5; domain 'd', descriptor path 'k')",
            "r.yaml: config error, unknown key 'bogus' (line 8, column 5; domain 'd', descriptor path 'k')",
        ]
    );
    // Inside `rate_limit`, its own keys come first; then any key the format knows.
    let errors = load("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unt: 1\n      shadowmode: true\n").unwrap_err();
    assert_eq!(
        errors,
        [
            "r.yaml: config error, unknown key 'requests_per_unt'; did you mean 'requests_per_unit'? (line 6, column 7; domain 'd', descriptor path 'k')",
            "r.yaml: config error, unknown key 'shadowmode'; did you mean 'shadow_mode'? (line 7, column 7; domain 'd', descriptor path 'k')",
            "r.yaml: rate_limit of 'd.k' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request) (line 4, column 5; domain 'd', descriptor path 'k')",
        ]
    );
}

#[test]
fn the_default_algorithm_applies_to_limits_that_name_none() {
    use Algorithm::{FixedWindow, SlidingWindow};
    let yaml = "domain: d\ndescriptors:\n  - key: plain\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    additional_limits:\n      - {unit: day, requests_per_unit: 100}\n    overrides: {acme: 50}\n  - key: named\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}\n";
    let with = |default_algorithm| {
        let options = CompileOptions {
            default_algorithm,
            ..CompileOptions::default()
        };
        compile_sources_with(&[("r.yaml".into(), yaml.into())], options).unwrap()
    };
    let algorithms = |set: &RuleSet, key: &str, value: &str| -> Vec<Algorithm> {
        let m = set.find("d", &[(key, value)]).unwrap();
        m.rule.limits.iter().map(|l| l.limit.algorithm).collect()
    };
    let fixed = with(FixedWindow);
    assert_eq!(algorithms(&fixed, "plain", "x"), [FixedWindow, FixedWindow]);
    assert_eq!(
        algorithms(&fixed, "plain", "acme"),
        [FixedWindow, FixedWindow]
    );
    assert_eq!(algorithms(&fixed, "named", "x"), [SlidingWindow]);
    assert!(fixed
        .dump()
        .contains("d.plain: unit=MINUTE requests_per_unit=5 algorithm=fixed_window,"));
    // Unset, the default stays sliding, and the two are counted apart (the id says which).
    let sliding = load(yaml).unwrap();
    assert_eq!(
        algorithms(&sliding, "plain", "x"),
        [SlidingWindow, SlidingWindow]
    );
    assert_eq!(with(SlidingWindow).rules(), sliding.rules());
    assert_ne!(fixed.rules()[0].id, sliding.rules()[0].id);
    assert_eq!(fixed.rules()[2].id, sliding.rules()[2].id);
}
