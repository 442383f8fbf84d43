//! The fuzz targets without a fuzzer, cheap enough for every CI run: every file under
//! `fuzz/regressions/<target>/` (inputs that once failed) and `fuzz/corpus/<target>/` (the
//! seeds) goes through its target, then proptests feed each target arbitrary bytes, seeds
//! with random bytes spliced in, and inputs built from the target's own vocabulary.
//!
//! The targets are `fuzz/src/lib.rs`, included here as a module, so the fuzzer and this test
//! run the same code. `scripts/fuzz.sh` runs the real fuzzer; see docs/development.md, "Fuzzing".

#[path = "../../fuzz/src/lib.rs"]
mod targets;

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::select;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files directly in `dir` (none when it does not exist), sorted.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("read a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// The target's seed corpus, which must not be empty.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir().join("corpus").join(target);
    let files = files_in(&dir);
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files
        .iter()
        .map(|f| std::fs::read(f).expect("read a seed"))
        .collect()
}

fn target(name: &str) -> targets::Target {
    targets::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no fuzz target {name}"))
        .1
}

/// Runs every regression and seed file through its target, naming the file that fails.
#[test]
fn regressions_and_seeds_pass_every_target() {
    for (name, run) in targets::TARGETS {
        let mut files = files_in(&fuzz_dir().join("regressions").join(name));
        let seeds = files_in(&fuzz_dir().join("corpus").join(name));
        assert!(!seeds.is_empty(), "no seeds in fuzz/corpus/{name}");
        files.extend(seeds);
        for file in files {
            let data = std::fs::read(&file).expect("read an input");
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "fuzz target {name} panicked on {} (replay: cargo test --test in_process fuzz_regressions::)",
                file.display()
            );
        }
    }
}

#[test]
fn the_seeds_reach_the_interesting_paths() {
    // Seeds that stopped compiling or matching would quietly leave the fuzzers to start from
    // nothing: the rules seeds mostly compile, and the fixed-rules matcher seeds mostly match.
    let compiled = seeds("rules")
        .iter()
        .filter(|s| {
            let text = String::from_utf8_lossy(s);
            let sources: Vec<(String, String)> = text
                .split('\0')
                .enumerate()
                .map(|(i, t)| (format!("f{i}.yaml"), t.to_owned()))
                .collect();
            sluice::rules::compile_sources(&sources, text.starts_with("#merge\n")).is_ok()
        })
        .count();
    assert!(compiled >= 20, "only {compiled} rules seeds compile");
    let body = std::fs::read(fuzz_dir().join("corpus/json/many.json")).unwrap();
    let req = sluice::server::json::parse_request(&body).expect("the json seed parses");
    assert_eq!(req.descriptors.len(), 6);
    // The report seeds: some taken whole, some refused by a check, some malformed.
    let read: Vec<_> = seeds("rlqs")
        .iter()
        .map(
            |s| match sluice::rlqs::check(s, Some(targets::RLQS_STREAM), 1024) {
                Ok(r) => ("taken", r.usages.len()),
                Err(sluice::rlqs::ReportError::Malformed(_)) => ("malformed", 0),
                Err(_) => ("refused", 0),
            },
        )
        .collect();
    let count = |what| read.iter().filter(|(w, _)| *w == what).count();
    assert!(count("taken") >= 8, "{read:?}");
    assert!(count("refused") >= 8 && count("malformed") >= 3, "{read:?}");
    assert!(read.iter().any(|&(_, usages)| usages >= 4), "{read:?}");
}

/// A seed with `insert` spliced in at `at` (a share of its length), after dropping `drop`
/// bytes there.
fn splice(seed: &[u8], at: f64, drop: usize, insert: &[u8]) -> Vec<u8> {
    let i = ((seed.len() as f64) * at) as usize;
    let j = (i + drop).min(seed.len());
    [&seed[..i], insert, &seed[j..]].concat()
}

fn mutated_seeds(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    (
        select(seeds(target)),
        0.0..1.0f64,
        0usize..16,
        prop::collection::vec(any::<u8>(), 0..16),
    )
        .prop_map(|(seed, at, drop, insert)| splice(&seed, at, drop, &insert))
}

/// YAML made of rules-file pieces: keys, flow maps, nesting, wildcards, bad values.
fn rules_like() -> impl Strategy<Value = String> {
    let piece = select(vec![
        "domain: d\n",
        "domain: e\n",
        "domain: \"\"\n",
        "descriptors:\n",
        "  - key: k\n",
        "  - key: k\n    value: v\n",
        "  - key: w\n    value: \"a*b*\"\n",
        "  - key: w\n    value: \"*\"\n",
        "    share_threshold: true\n",
        "    detailed_metric: true\n",
        "    value_to_metric: true\n",
        "    shadow_mode: true\n",
        "    rate_limit: {unit: second, requests_per_unit: 1}\n",
        "    rate_limit: {unit: minute, unit_multiplier: 0, requests_per_unit: 2}\n",
        "    rate_limit: {unit: fortnight, requests_per_unit: -1}\n",
        "    rate_limit: {unlimited: true, requests_per_unit: 3}\n",
        "    rate_limit: {name: n, unit: hour, requests_per_unit: 9, replaces: [{name: n}]}\n",
        "    rate_limit: {unit: day, requests_per_unit: 4294967296, algorithm: fixed_window}\n",
        "    additional_limits: [{unit: second, requests_per_unit: 1}]\n",
        "    descriptors:\n",
        "      - key: j\n",
        "      - key: j\n        value: \"*x\"\n",
        "        rate_limit: {unit: week, requests_per_unit: 5}\n",
        "    metadata: {a: [1, {b: c}]}\n",
        "bogus: 1\n",
        "\0",
        "#merge\n",
        "- [\n",
        "&a x\n",
        "*a\n",
        "? \n",
        "  \t\n",
    ]);
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

/// A matcher input for the fixed rules: domain line, then `key=value` lines.
fn matcher_like() -> impl Strategy<Value = String> {
    let key = select(vec!["a", "w", "n", "m", "o", "s", "u", "z", ""]);
    let value = prop_oneof![
        select(vec![
            "exact",
            "allowed",
            "prefix",
            "pre",
            "xpost",
            "post",
            "middledle",
            "mid*dle*",
            "xzy",
            "*",
            "",
        ])
        .prop_map(str::to_owned),
        "[a-z*=._]{0,10}",
    ];
    (
        select(vec!["fuzz", "more", "none", ""]),
        prop::collection::vec((key, value), 0..6),
    )
        .prop_map(|(domain, entries)| {
            let mut text = domain.to_owned();
            for (k, v) in entries {
                text.push('\n');
                text.push_str(k);
                text.push('=');
                text.push_str(&v);
            }
            text
        })
}

/// A proto3 JSON request with numbers and names in every shape the parser accepts, and
/// some it must refuse.
fn json_like() -> impl Strategy<Value = String> {
    let int = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<u32>().prop_map(|n| format!("\"{n}\"")),
        select(vec![
            "-1",
            "1.5",
            "\"x\"",
            "null",
            "1e3",
            "18446744073709551616"
        ])
        .prop_map(str::to_owned),
    ];
    let unit = prop_oneof![
        any::<i32>().prop_map(|n| n.to_string()),
        select(vec![
            "\"SECOND\"",
            "\"DAY\"",
            "\"YEAR\"",
            "\"UNKNOWN\"",
            "\"week\""
        ])
        .prop_map(str::to_owned),
    ];
    let entry = (
        select(vec!["a", "w", "n", "m", "o", "s", "u"]),
        "[a-z*]{0,6}",
    )
        .prop_map(|(k, v)| format!(r#"{{"key":"{k}","value":"{v}"}}"#));
    let descriptor = (
        prop::collection::vec(entry, 0..4),
        prop::option::of((int.clone(), unit)),
        prop::option::of(int.clone()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| {
            let mut d = format!(r#"{{"entries":[{}]"#, entries.join(","));
            if let Some((rpu, unit)) = limit {
                d += &format!(r#","limit":{{"requestsPerUnit":{rpu},"unit":{unit}}}"#);
            }
            if let Some(h) = hits {
                d += &format!(r#","hitsAddend":{h}"#);
            }
            if negative {
                d += r#","isNegativeHits":true"#;
            }
            d + "}"
        });
    (
        select(vec!["fuzz", "more", ""]),
        prop::collection::vec(descriptor, 0..5),
        prop::option::of(int),
    )
        .prop_map(|(domain, descriptors, hits)| {
            let hits = hits
                .map(|h| format!(r#","hits_addend":{h}"#))
                .unwrap_or_default();
            format!(
                r#"{{"domain":"{domain}","descriptors":[{}]{hits}}}"#,
                descriptors.join(",")
            )
        })
}

/// Protobuf's wire format, by hand: a field's key, a varint, a length-delimited field.
fn wire_key(tag: u64, wire: u64) -> Vec<u8> {
    varint(tag << 3 | wire)
}

fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

fn delimited(tag: u64, body: &[u8]) -> Vec<u8> {
    [wire_key(tag, 2), varint(body.len() as u64), body.to_vec()].concat()
}

fn varint_field(tag: u64, n: u64) -> Vec<u8> {
    [wire_key(tag, 0), varint(n)].concat()
}

/// A usage report built field by field, as the wire lets a client send it: bucket entries
/// with keys repeated, missing or empty, fields sent twice (merged) or unknown, durations of
/// every sign and range, counts up to 2^64 − 1, the domain or none.
fn rlqs_like() -> impl Strategy<Value = Vec<u8>> {
    let text = || select(vec!["tenant", "acme", "a", "", "edge", "other"]);
    let entry = (prop::option::of(text()), prop::option::of(text())).prop_map(|(k, v)| {
        let mut e = k.map_or(Vec::new(), |k| delimited(1, k.as_bytes()));
        e.extend(v.map_or(Vec::new(), |v| delimited(2, v.as_bytes())));
        delimited(1, &e)
    });
    let bucket = prop::collection::vec(entry, 0..5).prop_map(|e| delimited(1, &e.concat()));
    let signed = select(vec![
        0i64,
        5,
        -1,
        3_600,
        3_601,
        999_999_999,
        1_000_000_000,
        i64::MAX,
    ]);
    let elapsed =
        (prop::option::of(signed.clone()), prop::option::of(signed)).prop_map(|(s, n)| {
            let mut d = s.map_or(Vec::new(), |s| varint_field(1, s as u64));
            d.extend(n.map_or(Vec::new(), |n| varint_field(2, n as u64)));
            delimited(2, &d)
        });
    let field = prop_oneof![
        bucket,
        elapsed,
        any::<u64>().prop_map(|n| varint_field(3, n)),
        any::<u64>().prop_map(|n| varint_field(4, n)),
        Just(varint_field(9, 1)),
        Just([wire_key(10, 1), vec![7; 8]].concat()),
    ];
    let usage = prop::collection::vec(field, 0..6).prop_map(|f| delimited(2, &f.concat()));
    (
        prop::option::of(select(vec!["edge", "other", ""])),
        prop::collection::vec(usage, 0..4),
    )
        .prop_map(|(domain, usages)| {
            let domain = domain.map_or(Vec::new(), |d| delimited(1, d.as_bytes()));
            [domain, usages.concat()].concat()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn rules_target_survives_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..512)) {
        targets::rules(&data);
    }

    #[test]
    fn rules_target_survives_mutated_seeds(data in mutated_seeds("rules")) {
        targets::rules(&data);
    }

    #[test]
    fn rules_target_survives_rules_like_yaml(text in rules_like()) {
        target("rules")(text.as_bytes());
    }

    #[test]
    fn matcher_target_survives_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        targets::matcher(&data);
    }

    #[test]
    fn matcher_target_survives_mutated_seeds(data in mutated_seeds("matcher")) {
        targets::matcher(&data);
    }

    #[test]
    fn matcher_target_survives_descriptors_of_the_fixed_rules(text in matcher_like()) {
        target("matcher")(text.as_bytes());
    }

    #[test]
    fn json_target_survives_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        targets::json(&data);
    }

    #[test]
    fn json_target_survives_mutated_seeds(data in mutated_seeds("json")) {
        targets::json(&data);
    }

    #[test]
    fn json_target_survives_requests_of_every_shape(text in json_like()) {
        target("json")(text.as_bytes());
    }

    #[test]
    fn rlqs_target_survives_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        targets::rlqs(&data);
    }

    #[test]
    fn rlqs_target_survives_mutated_seeds(data in mutated_seeds("rlqs")) {
        targets::rlqs(&data);
    }

    #[test]
    fn rlqs_target_survives_reports_built_on_the_wire(data in rlqs_like()) {
        target("rlqs")(&data);
    }
}
