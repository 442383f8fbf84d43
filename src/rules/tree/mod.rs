//! The descriptor tree of a compiled domain: per level, exact values, wildcard patterns in file
//! order and the key-only node, and the lookup that picks one of them for a request value; and
//! the values the level's `overrides` name, each with its own rule. The
//! wildcards of a level are indexed by shape ([`WildcardIndex`]), so a lookup costs a few passes
//! over the value however many patterns there are (at most [`MAX_WILDCARD_CHECKS`] more).
//!
//! Files: `wildcard.rs` (the index by shape), `trie.rs` (the byte tries it walks),
//! `automaton.rs` (Aho-Corasick for `*a*`), `glob.rs` (one pattern checked by itself),
//! `work.rs` (the bytes a lookup examines, counted in tests).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

mod automaton;
mod glob;
mod trie;
mod wildcard;
pub(crate) mod work;

use wildcard::WildcardIndex;

/// A map of the tree's names (domains, keys, values) under [`NameHasher`].
pub(crate) type Map<V> = HashMap<String, V, BuildHasherDefault<NameHasher>>;

/// Hashes the tree's names with XXH3 rather than std's SipHash: a request looks up its
/// domain, each entry's key, and its last value's override and exact value, and SipHash
/// cost some 100 instructions a lookup more (`benches/cpu.sh`, `MODE=instructions`).
/// SipHash's random keys guard a map whose keys an attacker chooses; these maps hold the
/// rules' names only, which a request cannot add to.
#[derive(Debug, Default)]
pub(crate) struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxh3_64_with_seed(bytes, self.0);
    }

    /// A `str`'s terminator (`0xff`), after its bytes.
    fn write_u8(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

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
    pub(crate) children: Map<KeyLevel>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyLevel {
    pub(crate) exact: Map<Node>,
    /// Wildcard patterns in file order: the first that matches wins.
    pub(crate) wildcards: Vec<(String, Node)>,
    /// The index of `wildcards`, built by [`KeyLevel::index_wildcards`] once the level's
    /// wildcards are all pushed.
    index: WildcardIndex,
    /// Hashes of the patterns in `wildcards`: compiling tells a duplicate without comparing
    /// every earlier pattern (40k patterns at one level made that 800M comparisons).
    seen: HashSet<u64>,
    pub(crate) any_value: Option<Box<Node>>,
    /// The `overrides` of the level's key-only and wildcard nodes: a value to the position of
    /// its own rule. A request's last entry looks here first, as it would look up an exact
    /// value (an override is that value's rule); values never repeat across a level's
    /// overrides and exact values (compiling checks).
    pub(crate) overrides: Map<usize>,
}

/// The most passes over a value that one level's wildcard patterns may need beyond the four
/// every lookup makes (the exact hash, the prefix and suffix tries, the substring automaton):
/// one per pattern checked one by one (a literal between two `*`s, other than `*a*`), plus
/// one per `a*b` prefix along the longest chain of nested ones (`/api/*/x` and
/// `/api/v1/*/y` nest: 2). Rules written for envoyproxy/ratelimit (a
/// trailing `*`) never come near it; a constant, not a setting, so that `sluice check`
/// agrees with every server on whether a file loads.
pub const MAX_WILDCARD_CHECKS: usize = 64;

/// Whether the wildcard `pattern` matches `value` (one pattern checked by itself).
pub(crate) fn wildcard_matches(pattern: &str, value: &str) -> bool {
    glob::Glob::new(pattern.as_bytes()).matches(value.as_bytes())
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

    /// Whether `pattern` is one of the level's wildcards already.
    pub(crate) fn has_wildcard(&self, pattern: &str) -> bool {
        self.seen.contains(&xxh3_64(pattern.as_bytes()))
            && self.wildcards.iter().any(|(p, _)| p == pattern)
    }

    /// Adds a wildcard pattern, after the others (file order).
    pub(crate) fn push_wildcard(&mut self, pattern: String, node: Node) {
        self.seen.insert(xxh3_64(pattern.as_bytes()));
        self.wildcards.push((pattern, node));
    }

    /// (Re)builds the wildcard index. Called after every batch of pushes, so a level that
    /// merged files is indexed in full. Returns how many patterns a lookup may have to
    /// check one by one (bounded by [`MAX_WILDCARD_CHECKS`] where the rules are compiled).
    pub(crate) fn index_wildcards(&mut self) -> usize {
        self.index = WildcardIndex::build(&self.wildcards);
        self.index.checks
    }

    /// The position in `wildcards` of the first pattern, in file order, that matches `value`.
    fn first_wildcard(&self, value: &[u8]) -> Option<usize> {
        if self.wildcards.is_empty() {
            return None;
        }
        self.index.first(value)
    }
}

#[cfg(test)]
mod tests;
