//! Tests of [`RuleSet::find_bucket`]: the issue's examples, precedence across keys, the
//! search for a complete match, its bounds, and counters shared with [`RuleSet::find`].

use std::collections::HashMap;

use super::*;
use crate::rules::tests::set;

const LIMIT: &str = "rate_limit: {unit: second, requests_per_unit: 1}";

fn map(entries: &[(&str, &str)]) -> HashMap<String, String> {
    entries
        .iter()
        .map(|&(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The rule's composite key a bucket resolves to in domain `d`.
fn rule(s: &RuleSet, entries: &[(&str, &str)]) -> Option<String> {
    s.find_bucket("d", &map(entries))
        .map(|m| m.rule.full_key.clone())
}

#[test]
fn the_issue_examples_resolve() {
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: name\n    value: prod\n    {LIMIT}\n  \
         - key: tenant\n    {LIMIT}\n    descriptors:\n      - key: method\n        {LIMIT}\n"
    ));
    assert_eq!(
        rule(&s, &[("name", "prod")]).as_deref(),
        Some("d.name_prod")
    );
    assert_eq!(rule(&s, &[("name", "dev")]), None);
    assert_eq!(rule(&s, &[("tenant", "acme")]).as_deref(), Some("d.tenant"));
    assert_eq!(
        rule(&s, &[("tenant", "acme"), ("method", "GET")]).as_deref(),
        Some("d.tenant.method")
    );
    // Key-only: one counter per tenant.
    let acme = s.find_bucket("d", &map(&[("tenant", "acme")])).unwrap();
    let beta = s.find_bucket("d", &map(&[("tenant", "beta")])).unwrap();
    assert_ne!(acme.entity, beta.entity);
}

#[test]
fn every_entry_must_be_used() {
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: tenant\n    {LIMIT}\n    descriptors:\n      \
         - key: method\n        {LIMIT}\n"
    ));
    // `path` is named nowhere; `method` only below `tenant`.
    assert_eq!(rule(&s, &[("tenant", "acme"), ("path", "/")]), None);
    assert_eq!(rule(&s, &[("method", "GET")]), None);
    assert_eq!(rule(&s, &[]), None);
    assert!(s
        .find_bucket("unknown", &map(&[("tenant", "acme")]))
        .is_none());
}

#[test]
fn the_last_entry_needs_a_limit_as_in_find() {
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: tenant\n    descriptors:\n      \
         - key: method\n        {LIMIT}\n"
    ));
    assert_eq!(rule(&s, &[("tenant", "acme")]), None);
    assert_eq!(s.find("d", &[("tenant", "acme")]).map(|m| m.index), None);
    assert!(rule(&s, &[("tenant", "acme"), ("method", "GET")]).is_some());
}

#[test]
fn within_a_key_exact_beats_wildcard_beats_key_only() {
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: name\n    value: prod\n    {LIMIT}\n  \
         - key: name\n    value: \"p*\"\n    {LIMIT}\n  - key: name\n    {LIMIT}\n"
    ));
    assert_eq!(
        rule(&s, &[("name", "prod")]).as_deref(),
        Some("d.name_prod")
    );
    assert_eq!(rule(&s, &[("name", "pre")]).as_deref(), Some("d.name_p*"));
    assert_eq!(rule(&s, &[("name", "dev")]).as_deref(), Some("d.name"));
}

#[test]
fn across_keys_precedence_comes_before_key_order() {
    // Both orders are complete; `a` sorts first, but `b` selects an exact node, and then a
    // wildcard beats a key-only node.
    let s = set(&format!(
        "domain: d\ndescriptors:\n  \
         - key: a\n    descriptors:\n      - key: b\n        {LIMIT}\n      - key: c\n        descriptors:\n          - key: b\n            {LIMIT}\n  \
         - key: b\n    value: x\n    descriptors:\n      - key: a\n        {LIMIT}\n  \
         - key: c\n    value: \"y*\"\n    descriptors:\n      - key: a\n        {LIMIT}\n"
    ));
    assert_eq!(
        rule(&s, &[("a", "1"), ("b", "x")]).as_deref(),
        Some("d.b_x.a")
    );
    assert_eq!(
        rule(&s, &[("a", "1"), ("b", "z")]).as_deref(),
        Some("d.a.b")
    );
    assert_eq!(
        rule(&s, &[("a", "1"), ("c", "yes")]).as_deref(),
        Some("d.c_y*.a")
    );
}

#[test]
fn ties_go_by_key_whatever_the_map_order() {
    let s = set(&format!(
        "domain: d\ndescriptors:\n  \
         - key: x\n    descriptors:\n      - key: y\n        {LIMIT}\n  \
         - key: y\n    descriptors:\n      - key: x\n        {LIMIT}\n"
    ));
    for _ in 0..8 {
        // A fresh map each time: std's maps iterate in a random order per map.
        assert_eq!(
            rule(&s, &[("y", "2"), ("x", "1")]).as_deref(),
            Some("d.x.y")
        );
    }
    // Any iterator of pairs will do, in any order.
    let pairs = [("y", "2"), ("x", "1")];
    let m = s.find_bucket("d", pairs.iter().map(|(k, v)| (k, v)));
    assert_eq!(m.map(|m| m.rule.full_key.as_str()), Some("d.x.y"));
}

#[test]
fn an_order_that_dead_ends_is_abandoned_for_the_next() {
    // `method` sorts first and is named at the top, but its node has no `tenant` below it: a
    // greedy walk would stop there.
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: method\n    {LIMIT}\n  \
         - key: tenant\n    descriptors:\n      - key: method\n        {LIMIT}\n"
    ));
    assert_eq!(
        rule(&s, &[("tenant", "acme"), ("method", "GET")]).as_deref(),
        Some("d.tenant.method")
    );
    assert_eq!(rule(&s, &[("method", "GET")]).as_deref(), Some("d.method"));
}

#[test]
fn the_counter_is_finds_for_the_same_order() {
    let s = set(&format!(
        "domain: d\ndescriptors:\n  - key: tenant\n    descriptors:\n      \
         - key: env\n        value: prod\n        descriptors:\n          \
         - key: path\n            value: \"/api/*\"\n            {LIMIT}\n          \
         - key: user\n            share_threshold: true\n            value: \"u*\"\n            {LIMIT}\n"
    ));
    for last in [("path", "/api/x"), ("user", "u1")] {
        let ordered = [("tenant", "acme"), ("env", "prod"), last];
        let by_find = s.find("d", &ordered).unwrap();
        let by_bucket = s.find_bucket("d", &map(&ordered)).unwrap();
        assert_eq!(by_bucket.index, by_find.index);
        assert_eq!(by_bucket.entity, by_find.entity);
    }
    // The values of key-only and wildcard levels tell counters apart; shared ones do not.
    let entity = |e: &[(&str, &str)]| s.find_bucket("d", &map(e)).unwrap().entity;
    let a = [("tenant", "acme"), ("env", "prod"), ("path", "/api/x")];
    assert_ne!(
        entity(&a),
        entity(&[("tenant", "acme"), ("env", "prod"), ("path", "/api/y")])
    );
    assert_eq!(
        entity(&[("tenant", "acme"), ("env", "prod"), ("user", "u1")]),
        entity(&[("tenant", "acme"), ("env", "prod"), ("user", "u2")])
    );
}

#[test]
fn a_map_longer_than_the_bound_has_no_rule_even_where_the_tree_is_that_deep() {
    // Every level has a limit, the last one below the bound.
    let n = MAX_BUCKET_ENTRIES + 1;
    let mut y = String::from("domain: d\ndescriptors:\n");
    let mut indent = String::new();
    for i in 0..n {
        y += &format!("{indent}- key: k{i:02}\n{indent}  {LIMIT}\n{indent}  descriptors:\n");
        indent += "  ";
    }
    y += &format!("{indent}- key: leaf\n");
    let s = set(&y);
    let mut entries: Vec<(String, String)> =
        (0..n).map(|i| (format!("k{i:02}"), "v".into())).collect();
    let ordered: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(s.find("d", &ordered).is_some(), "the tree is {n} deep");
    let bucket = |e: &[(String, String)]| s.find_bucket("d", e.iter().map(|(k, v)| (k, v)));
    assert!(bucket(&entries).is_none());
    entries.pop();
    assert!(bucket(&entries).is_some());
}

/// A tree that nests keys `k0`..`k5` in every order, with one rule at the end of one order.
fn every_order(rule_at: &[usize]) -> RuleSet {
    fn level(y: &mut String, depth: usize, path: &mut Vec<usize>, rule_at: &[usize]) {
        let indent = "    ".repeat(depth);
        for k in 0..6 {
            if path.contains(&k) {
                continue;
            }
            path.push(k);
            *y += &format!("{indent}  - key: k{k}\n");
            if path.len() == 6 {
                if path == rule_at {
                    *y += &format!("{indent}    {LIMIT}\n");
                }
            } else {
                *y += &format!("{indent}    descriptors:\n");
                level(y, depth + 1, path, rule_at);
            }
            path.pop();
        }
    }
    let mut y = String::from("domain: d\ndescriptors:\n");
    level(&mut y, 0, &mut Vec::new(), rule_at);
    set(&y)
}

#[test]
fn the_search_is_bounded() {
    let all: Vec<(String, String)> = (0..6).map(|k| (format!("k{k}"), "v".into())).collect();
    let find = |s: &RuleSet| {
        s.find_bucket("d", all.iter().map(|(k, v)| (k, v)))
            .map(|m| m.rule.full_key.clone())
    };
    // The first order tried: six levels, 21 lookups.
    assert_eq!(
        find(&every_order(&[0, 1, 2, 3, 4, 5])).as_deref(),
        Some("d.k0.k1.k2.k3.k4.k5")
    );
    // The last order tried needs 1,956 lookups: past the budget, no rule.
    assert_eq!(find(&every_order(&[5, 4, 3, 2, 1, 0])), None);
}
