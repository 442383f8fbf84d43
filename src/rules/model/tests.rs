//! Tests of parsing and key-checking rules files.

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
