//! Tests of validating and compiling rules files: every error, as printed.

use super::limit::MAX_WINDOW_MS;
use super::*;
use crate::core::Algorithm;
use crate::rules::model::{parse, DescriptorConfig, RulesFile};

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
        errs[0]
            .message
            .contains("rate_limit.strict: invalid type: string \"sometimes\", expected a boolean"),
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
fn a_concurrency_limit_is_lenient_alone_and_takes_no_burst() {
    let s = set("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 8, algorithm: concurrency}\n");
    let l = &s.rules()[0].limits[0];
    assert_eq!(
        (l.limit.algorithm, l.limit.window_ms, l.strict),
        (Algorithm::Concurrency, 300_000, false)
    );
    let yaml = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: concurrency, strict: true}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: concurrency, burst: 8}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: concurrency}\n    additional_limits:\n      - {unit: hour, requests_per_unit: 100}\n";
    assert_eq!(
        errors(yaml),
        [
            "edge.yaml: edge.a: strict cannot be used with algorithm: concurrency (a denied acquisition is never released) (line 4, column 78; domain 'edge', descriptor path 'a')",
            "edge.yaml: edge.b: burst needs algorithm: token_bucket (line 6, column 78; domain 'edge', descriptor path 'b')",
            "edge.yaml: algorithm: concurrency cannot be combined with other limits in one rule (a release gives back to every limit of it): 'edge.c' (line 9, column 5; domain 'edge', descriptor path 'c')",
        ]
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
            "b.yaml: invalid algorithm 'foo' (expected sliding_window, fixed_window, token_bucket or concurrency) (domain 'd', descriptor path 'c')",
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
        let mut y =
            String::from("domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n");
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

#[test]
fn rules_whose_every_limit_is_small_are_made_exact() {
    let mut s = set("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 8}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 10}\n    additional_limits:\n      - {unit: day, requests_per_unit: 1000}\n  - key: d\n    rate_limit: {unit: minute, requests_per_unit: 16}\n  - key: e\n    rate_limit: {unlimited: true}\n");
    assert!(!s.has_exact());
    // A day of 3 and a bucket of burst 8 (its refill does not count): exact. A rule with
    // one limit past the threshold, one at it, and an unlimited one: not.
    assert_eq!(s.decide_exactly_below(16), 2);
    let exact: Vec<bool> = s.rules().iter().map(|r| r.exact).collect();
    assert_eq!(exact, [true, true, false, false, false]);
    assert!(s.has_exact() && s.dump().contains("exact: true"));
    // 0: never.
    let mut s = set(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 0}\n",
    );
    assert_eq!(s.decide_exactly_below(0), 0);
}
