//! The descriptor tree of a compiled domain: per level, exact values, wildcard patterns in file
//! order and the key-only node, and the lookup that picks one of them for a request value.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Exact,
    Wildcard,
    AnyValue,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) kind: Kind,
    /// `key` or `key_value`, the reference's composite key part.
    pub(crate) final_key: String,
    pub(crate) rule: Option<usize>,
    pub(crate) share_threshold: bool,
    pub(crate) value_to_metric: bool,
    pub(crate) children: HashMap<String, KeyLevel>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyLevel {
    pub(crate) exact: HashMap<String, Node>,
    /// Wildcard patterns in file order: the first that matches wins.
    pub(crate) wildcards: Vec<(String, Node)>,
    /// The index of `wildcards` by literal prefix (the bytes before the first `*`), built by
    /// [`KeyLevel::index_wildcards`] once the level's wildcards are all pushed.
    index: WildcardIndex,
    pub(crate) any_value: Option<Box<Node>>,
}

/// Wildcards grouped by literal prefix. A value can only match a pattern whose prefix is a
/// prefix of the value, so a lookup hashes the value's prefix of each length that some
/// pattern's prefix has, longest first, and tries only the patterns found. Its cost grows with
/// the number of distinct prefix lengths, not of patterns, and it touches a few cache lines
/// per length: a server between requests finds its caches cold, and a binary search over
/// 1,000 prefixes missed on every probe.
#[derive(Debug, Default)]
struct WildcardIndex {
    /// Open addressing, linear probing, a power of two long: (hash of a prefix, its group in
    /// `groups`), `EMPTY` in the group for a free slot. Slots whose hash equals the probe's
    /// are all tried: `wildcard_match` on the full pattern verifies the prefix, so a hash
    /// collision costs time, never a wrong match. The hash has no secret seed: the table's
    /// keys come from the rules file, so a request cannot lengthen its probe chains.
    slots: Vec<(u64, u32)>,
    /// Per distinct prefix, the positions of its patterns in `wildcards`, ascending.
    groups: Vec<Box<[u32]>>,
    /// The distinct prefix lengths, longest first, each with the smallest position of any
    /// pattern whose prefix is that long or shorter: once a match is found, the lookup stops
    /// where nothing shorter could come earlier in the file.
    lengths: Vec<(usize, u32)>,
}

const EMPTY: u32 = u32::MAX;

impl WildcardIndex {
    fn build(patterns: &[(String, Node)]) -> WildcardIndex {
        let mut by_prefix: HashMap<&[u8], Vec<u32>> = HashMap::new();
        for (i, (p, _)) in patterns.iter().enumerate() {
            // Positions fit in u32: a rules file is at most 4 MiB (prescan.rs).
            by_prefix
                .entry(literal_prefix(p.as_bytes()))
                .or_default()
                .push(i as u32);
        }
        let mut slots = vec![(0, EMPTY); (by_prefix.len() * 2).next_power_of_two()];
        let mask = slots.len() - 1;
        let mut groups = Vec::with_capacity(by_prefix.len());
        let mut lengths: Vec<(usize, u32)> = Vec::new();
        for (prefix, group) in by_prefix {
            let hash = xxh3_64(prefix);
            let mut at = hash as usize & mask;
            while slots[at].1 != EMPTY {
                at = (at + 1) & mask;
            }
            slots[at] = (hash, groups.len() as u32);
            lengths.push((prefix.len(), group[0]));
            groups.push(group.into_boxed_slice());
        }
        lengths.sort_unstable();
        lengths.dedup_by(|later, earlier| {
            earlier.0 == later.0 && {
                earlier.1 = earlier.1.min(later.1);
                true
            }
        });
        // Shortest first here, so the running minimum covers each length and the shorter.
        let mut first = u32::MAX;
        for (_, f) in &mut lengths {
            first = first.min(*f);
            *f = first;
        }
        lengths.reverse();
        WildcardIndex {
            slots,
            groups,
            lengths,
        }
    }

    /// The position of the first pattern, in file order, that matches `value`.
    fn first(&self, patterns: &[(String, Node)], value: &[u8]) -> Option<usize> {
        let mask = self.slots.len().wrapping_sub(1);
        let mut best = u32::MAX;
        for &(len, first) in &self.lengths {
            if first >= best {
                break;
            }
            let Some(prefix) = value.get(..len) else {
                continue;
            };
            let hash = xxh3_64(prefix);
            let mut at = hash as usize & mask;
            while self.slots[at].1 != EMPTY {
                let (h, group) = self.slots[at];
                if h == hash {
                    for &i in self.groups[group as usize]
                        .iter()
                        .take_while(|i| **i < best)
                    {
                        if wildcard_match(patterns[i as usize].0.as_bytes(), value) {
                            best = i;
                            break;
                        }
                    }
                }
                at = (at + 1) & mask;
            }
        }
        (best != u32::MAX).then_some(best as usize)
    }
}

impl KeyLevel {
    pub(crate) fn lookup(&self, value: &str) -> Option<&Node> {
        self.exact
            .get(value)
            .or_else(|| {
                self.first_wildcard(value.as_bytes())
                    .map(|i| &self.wildcards[i].1)
            })
            .or(self.any_value.as_deref())
    }

    /// (Re)builds the wildcard index. Called after every batch of pushes, so a level that
    /// merged files is indexed in full.
    pub(crate) fn index_wildcards(&mut self) {
        self.index = WildcardIndex::build(&self.wildcards);
    }

    /// The position in `wildcards` of the first pattern, in file order, that matches `value`.
    fn first_wildcard(&self, value: &[u8]) -> Option<usize> {
        if self.wildcards.is_empty() {
            return None;
        }
        self.index.first(&self.wildcards, value)
    }
}

/// The bytes of `pattern` before its first `*`: every value it matches starts with them.
fn literal_prefix(pattern: &[u8]) -> &[u8] {
    let end = pattern
        .iter()
        .position(|&c| c == b'*')
        .unwrap_or(pattern.len());
    &pattern[..end]
}

/// Whether `value` matches `pattern`, where `*` matches zero or more bytes. Linear in practice:
/// on a mismatch it retries only from the last `*`.
pub(crate) fn wildcard_match(pattern: &[u8], value: &[u8]) -> bool {
    let (mut p, mut v) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while v < value.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, v));
            p += 1;
        } else if p < pattern.len() && pattern[p] == value[v] {
            p += 1;
            v += 1;
        } else if let Some((sp, sv)) = star {
            p = sp + 1;
            v = sv + 1;
            star = Some((sp, sv + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node() -> Node {
        Node {
            kind: Kind::Wildcard,
            final_key: String::new(),
            rule: None,
            share_threshold: false,
            value_to_metric: false,
            children: HashMap::new(),
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

    /// The definition: the first pattern in file order that matches.
    fn scan(patterns: &[String], value: &str) -> Option<usize> {
        patterns
            .iter()
            .position(|p| wildcard_match(p.as_bytes(), value.as_bytes()))
    }

    proptest! {
        // A small alphabet, so prefixes nest and share bytes and most values match something.
        #[test]
        fn the_prefix_index_finds_the_first_match_in_file_order(
            patterns in proptest::collection::vec("[ab*]{0,5}", 0..24),
            values in proptest::collection::vec("[ab]{0,6}", 1..16),
        ) {
            let patterns: Vec<String> = patterns.into_iter().filter(|p| p.contains('*')).collect();
            let level = level(&patterns);
            for v in &values {
                prop_assert_eq!(level.first_wildcard(v.as_bytes()), scan(&patterns, v), "{}", v);
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
        ] {
            assert_eq!(wildcard_match(p.as_bytes(), v.as_bytes()), m, "{p} ~ {v}");
        }
    }
}
