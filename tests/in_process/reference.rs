//! Table-driven rules tests from `tests/data/reference_cases.yaml`: every example of
//! envoyproxy/ratelimit's README and its config tests — what matches, what a match reports
//! (limit, stats key, replaces, shared counters) — and every validation message.

use std::collections::HashMap;

use serde::Deserialize;
use sluice::rules::{self, RuleSet, Unit};

#[derive(Deserialize)]
struct Cases {
    match_cases: Vec<MatchCase>,
    validation_cases: Vec<ValidationCase>,
}

#[derive(Deserialize)]
struct File {
    name: String,
    content: String,
}

#[derive(Deserialize)]
struct MatchCase {
    name: String,
    #[serde(default)]
    merge_domain_config: bool,
    files: Vec<File>,
    requests: Vec<Request>,
}

#[derive(Deserialize)]
struct Request {
    domain: String,
    entries: Vec<(String, String)>,
    expect: Expect,
    stats_key: Option<String>,
    replaces: Option<Vec<String>>,
    share_threshold_key: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Expect {
    Word(String),
    Limit { limit: ExpectedLimit },
}

#[derive(Deserialize, Debug)]
struct ExpectedLimit {
    requests_per_unit: u32,
    unit: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
}

#[derive(Deserialize)]
struct ValidationCase {
    name: String,
    #[serde(default)]
    merge_domain_config: bool,
    files: Vec<File>,
    errors: Vec<String>,
}

fn cases() -> Cases {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/reference_cases.yaml"
    ))
    .unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn compile(files: &[File], merge: bool) -> Result<RuleSet, Vec<String>> {
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.name.clone(), f.content.clone()))
        .collect();
    rules::compile_sources(&sources, merge).map_err(|e| e.iter().map(ToString::to_string).collect())
}

#[test]
fn reference_matching_cases() {
    let cases = cases();
    assert!(cases.match_cases.len() >= 25, "the table lost cases");
    let mut checked = 0;
    for case in &cases.match_cases {
        let set = compile(&case.files, case.merge_domain_config)
            .unwrap_or_else(|e| panic!("{}: rules rejected: {e:?}", case.name));
        let mut shared: HashMap<&str, u128> = HashMap::new();
        let mut by_entity: HashMap<u128, &str> = HashMap::new();
        for (i, r) in case.requests.iter().enumerate() {
            let at = format!("{} / request {i} {:?}", case.name, r.entries);
            let entries: Vec<(&str, &str)> = r
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let found = set.find(&r.domain, &entries);
            match (&r.expect, found) {
                (Expect::Word(w), None) if w == "none" => {}
                (Expect::Word(w), Some(m)) if w == "unlimited" => {
                    assert!(
                        m.rule.unlimited,
                        "{at}: expected unlimited, got {:?}",
                        m.rule
                    );
                }
                (Expect::Limit { limit }, Some(m)) => {
                    let l = &m.rule.limits[0];
                    assert!(!m.rule.unlimited, "{at}");
                    assert_eq!(l.limit.requests_per_unit, limit.requests_per_unit, "{at}");
                    assert_eq!(Some(l.unit), Unit::parse(&limit.unit), "{at}");
                    assert_eq!(m.rule.name, limit.name, "{at}");
                    assert_eq!(m.rule.shadow_mode, limit.shadow_mode, "{at}");
                    assert_eq!(m.rule.quota_mode, limit.quota_mode, "{at}");
                }
                (want, got) => panic!("{at}: expected {want:?}, got {:?}", got.map(|m| m.rule)),
            }
            let Some(m) = found else { continue };
            if let Some(key) = &r.stats_key {
                let got = set
                    .metric_key(&m, &entries)
                    .unwrap_or_else(|| m.rule.full_key.clone());
                assert_eq!(&got, key, "{at}: stats key");
            }
            if let Some(names) = &r.replaces {
                assert_eq!(&m.rule.replaces, names, "{at}: replaces");
            }
            if let Some(k) = &r.share_threshold_key {
                // Requests with one shared key use one counter; different keys, different ones.
                let e = *shared.entry(k).or_insert(m.entity);
                assert_eq!(e, m.entity, "{at}: should share the counter of {k}");
                let owner = *by_entity.entry(m.entity).or_insert(k);
                assert_eq!(owner, k, "{at}: shares a counter with another key");
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "too few requests checked: {checked}");
}

#[test]
fn reference_validation_cases() {
    let cases = cases();
    assert!(cases.validation_cases.len() >= 15, "the table lost cases");
    for case in &cases.validation_cases {
        let errors = match compile(&case.files, case.merge_domain_config) {
            Ok(_) => panic!("{}: rules accepted, expected {:?}", case.name, case.errors),
            Err(e) => e,
        };
        for want in &case.errors {
            assert!(
                errors.iter().any(|e| e.contains(want.as_str())),
                "{}: missing error {want:?} in {errors:#?}",
                case.name
            );
        }
        // Nothing unexpected, beyond a decoder's own account of a structural problem.
        for e in &errors {
            assert!(
                case.errors.iter().any(|w| e.contains(w.as_str()))
                    || e.contains(": error loading config file"),
                "{}: unexpected error {e:?}",
                case.name
            );
        }
    }
}
