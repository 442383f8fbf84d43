//! Tests of the descriptor tree's wildcard index against the definition of a match.

use super::glob::Glob;
use super::trie::TrieBuilder;
use super::*;
use proptest::prelude::*;

fn node() -> Node {
    Node {
        kind: Kind::Wildcard,
        final_key: String::new(),
        rule: None,
        share_threshold: false,
        value_to_metric: false,
        children: Map::default(),
    }
}

fn level(patterns: &[String]) -> KeyLevel {
    let mut level = KeyLevel {
        wildcards: patterns.iter().map(|p| (p.clone(), node())).collect(),
        ..KeyLevel::default()
    };
    level.index_wildcards();
    level
}

/// The definition of a match, by the book: `*` matches any run of bytes, tried at every
/// length (exponential, for short test strings only).
fn naive_match(pattern: &[u8], value: &[u8]) -> bool {
    match pattern.split_first() {
        None => value.is_empty(),
        Some((b'*', rest)) => (0..=value.len()).any(|k| naive_match(rest, &value[k..])),
        Some((c, rest)) => value.first() == Some(c) && naive_match(rest, &value[1..]),
    }
}

/// The definition of the winner: the first pattern in file order that matches.
fn scan(patterns: &[String], value: &str) -> Option<usize> {
    patterns
        .iter()
        .position(|p| naive_match(p.as_bytes(), value.as_bytes()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    // A small alphabet, so prefixes, suffixes and middles nest and overlap and most
    // values match something: every shape of the index, side by side in one level.
    #[test]
    fn the_index_finds_the_first_match_in_file_order(
        patterns in proptest::collection::vec("[ab*]{0,7}", 0..24),
        values in proptest::collection::vec("[ab]{0,9}", 1..16),
    ) {
        let patterns: Vec<String> = patterns.into_iter().filter(|p| p.contains('*')).collect();
        let level = level(&patterns);
        for v in &values {
            prop_assert_eq!(level.first_wildcard(v.as_bytes()), scan(&patterns, v), "{}", v);
        }
    }

    // One pattern against one value, with a third byte that patterns hold and values
    // may not, so that anchors fail as often as they hold.
    #[test]
    fn a_glob_matches_as_defined(pattern in "[abc*]{0,10}", value in "[ab]{0,12}") {
        let glob = Glob::new(pattern.as_bytes());
        if pattern.contains('*') {
            prop_assert_eq!(glob.matches(value.as_bytes()), naive_match(pattern.as_bytes(), value.as_bytes()));
        }
    }
}

#[test]
fn a_thousand_wildcards_pick_the_first_match() {
    // Longest prefix first, then catch-alls of other shapes behind them.
    let mut patterns: Vec<String> = (0..1000).rev().map(|i| format!("v{i}*")).collect();
    patterns.extend(["*z".to_string(), "v*9".to_string(), "*".to_string()]);
    let level = level(&patterns);
    for (value, want) in [
        ("v5", Some(994)),
        ("v55", Some(944)),
        ("v999x", Some(0)),
        ("v0", Some(999)),
        ("vz", Some(1000)),
        ("v9", Some(990)),
        ("w", Some(1002)),
        ("", Some(1002)),
    ] {
        assert_eq!(level.first_wildcard(value.as_bytes()), want, "{value}");
        assert_eq!(scan(&patterns, value), want, "{value}");
    }
}

#[test]
fn every_shape_is_found_and_the_earliest_wins() {
    let patterns: Vec<String> = [
        "/api/*/users",  // 0: a*b
        "*bot*",         // 1: *a*
        "*.example.com", // 2: *a
        "/api/v1/*",     // 3: a*
        "a*b*c",         // 4: the rest
        "/api/*",        // 5: a*
        "*",             // 6
    ]
    .map(String::from)
    .to_vec();
    let level = level(&patterns);
    for (value, want) in [
        ("/api/v1/users", 0),
        ("/api/v1/usersx", 3),
        ("/api/v2/x", 5),
        ("googlebot.example.com", 1),
        ("www.example.com", 2),
        ("abc", 4),
        ("a-b-c-", 6),
        // The suffix may not overlap the prefix.
        ("/api/users", 5),
        ("/api//users", 0),
    ] {
        assert_eq!(
            level.first_wildcard(value.as_bytes()),
            Some(want),
            "{value}"
        );
        assert_eq!(scan(&patterns, value), Some(want), "{value}");
    }
    // Only the patterns of the last shape, and none of the others, are checked one by
    // one.
    let mut l = KeyLevel {
        wildcards: patterns.iter().map(|p| (p.clone(), node())).collect(),
        ..KeyLevel::default()
    };
    assert_eq!(l.index_wildcards(), 1 + 1);
}

#[test]
fn checks_count_other_shapes_and_nested_prefix_groups() {
    let count = |patterns: &[&str]| {
        let mut l = KeyLevel {
            wildcards: patterns.iter().map(|p| (p.to_string(), node())).collect(),
            ..KeyLevel::default()
        };
        l.index_wildcards()
    };
    // Any number of the indexed shapes: one pass for the a*b group a walk reaches.
    let many: Vec<String> = (0..500)
        .flat_map(|i| {
            [
                format!("p{i}*"),
                format!("*s{i}"),
                format!("*m{i}*"),
                format!("x{i}-*y"),
            ]
        })
        .collect();
    assert_eq!(
        count(&many.iter().map(String::as_str).collect::<Vec<_>>()),
        1
    );
    assert_eq!(
        count(
            &many
                .iter()
                .step_by(4)
                .map(String::as_str)
                .collect::<Vec<_>>()
        ),
        0
    );
    // a*b groups side by side: one walk reaches one of them.
    assert_eq!(count(&["a*x", "b*x", "c*y"]), 1);
    // Nested prefixes: one walk reaches all three.
    assert_eq!(count(&["a*x", "ab*x", "abc*y", "abc*z"]), 3);
    assert_eq!(count(&["a*b*c", "*a*b*", "a*b*", "**", "a**b"]), 3 + 1);
}

#[test]
fn a_lookup_makes_at_most_four_passes_plus_one_per_check() {
    // Every shape at once, 1,000 of each indexed one, and patterns that must be checked
    // one by one; values built to go deep into every trie and to match late or never.
    let mut patterns = Vec::new();
    for i in 0..1000 {
        patterns.push(format!("{}{i}*", "a".repeat(40)));
        patterns.push(format!("*{i}{}", "a".repeat(40)));
        patterns.push(format!("*a{i}a*"));
        patterns.push(format!("{}*x{i}", "a".repeat(1 + i % 50)));
    }
    for i in 0..40 {
        patterns.push(format!("*a*{i}*aa*b"));
    }
    let mut l = KeyLevel {
        wildcards: patterns.iter().map(|p| (p.clone(), node())).collect(),
        ..KeyLevel::default()
    };
    let checks = l.index_wildcards() as u64;
    assert_eq!(
        checks,
        40 + 50,
        "40 patterns, and 'a'..'aaaa…' nested 50 deep"
    );
    let longest = patterns.iter().map(String::len).max().unwrap() as u64;
    for value in [
        "a".repeat(4096),
        "a".repeat(2048) + &"9".repeat(2048),
        "a0".repeat(2048),
        format!("{}{}", "a".repeat(4000), "x1"),
        "b".repeat(4096),
    ] {
        work::take();
        let got = l.first_wildcard(value.as_bytes());
        let work = work::take();
        let bound = (4 + checks) * (value.len() as u64 + longest);
        assert!(
            work <= bound,
            "{work} > {bound} for a value like {}",
            &value[..8]
        );
        assert_eq!(got, scan_quick(&patterns, &value));
    }
}

/// The first match by the glob itself (the naive definition is exponential on 4 KB).
fn scan_quick(patterns: &[String], value: &str) -> Option<usize> {
    patterns
        .iter()
        .position(|p| Glob::new(p.as_bytes()).matches(value.as_bytes()))
}

#[test]
fn a_node_finds_each_of_up_to_256_children() {
    // Fan-outs across the 16-byte chunks of `Trie::child`, in a scrambled order.
    for fanout in [1, 2, 15, 16, 17, 31, 32, 33, 255, 256] {
        let mut b = TrieBuilder::new();
        let bytes: Vec<u8> = (0..fanout).map(|k| (k * 97 % 256) as u8).collect();
        let nodes: Vec<u32> = bytes
            .iter()
            .map(|&c| b.insert(0, [c].into_iter()))
            .collect();
        let t = b.freeze();
        for c in 0..=255u8 {
            let want = bytes.iter().position(|&l| l == c).map(|k| nodes[k]);
            assert_eq!(t.child(0, c), want, "fan-out {fanout}, byte {c}");
        }
        // The leaves have no children, whatever bytes follow their (empty) runs.
        assert_eq!(t.child(nodes[0], bytes[0]), None);
    }
}

#[test]
fn wildcards_match_anywhere() {
    for (p, v, m) in [
        ("foo*", "foo", true),
        ("foo*", "foobar", true),
        ("*bar", "foobar", true),
        ("f*b*r", "foobar", true),
        ("f*b*r", "foobaz", false),
        ("*", "", true),
        ("a*a", "a", false),
        ("a*a", "aa", true),
        ("*ab", "aab", true),
        ("a*b*a", "aa", false),
        ("a*b*a", "abba", true),
        ("*aab*", "aaab", true),
    ] {
        assert_eq!(
            Glob::new(p.as_bytes()).matches(v.as_bytes()),
            m,
            "{p} ~ {v}"
        );
        assert_eq!(naive_match(p.as_bytes(), v.as_bytes()), m, "{p} ~ {v}");
        assert_eq!(
            level(&[p.to_string()])
                .first_wildcard(v.as_bytes())
                .is_some(),
            m,
            "{p} ~ {v}"
        );
    }
}
