//! The descriptor tree of a compiled domain: per level, exact values, wildcard patterns in file
//! order and the key-only node, and the lookup that picks one of them for a request value. The
//! wildcards of a level are indexed by shape ([`WildcardIndex`]), so a lookup costs a few passes
//! over the value however many patterns there are (at most [`MAX_WILDCARD_CHECKS`] more).

use std::collections::{HashMap, HashSet};

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
    /// The index of `wildcards`, built by [`KeyLevel::index_wildcards`] once the level's
    /// wildcards are all pushed.
    index: WildcardIndex,
    /// Hashes of the patterns in `wildcards`: compiling tells a duplicate without comparing
    /// every earlier pattern (40k patterns at one level made that 800M comparisons).
    seen: HashSet<u64>,
    pub(crate) any_value: Option<Box<Node>>,
}

/// The most passes over a value that one level's wildcard patterns may need beyond the four
/// every lookup makes (the exact hash, the prefix and suffix tries, the substring automaton):
/// one per pattern checked one by one (a literal between two `*`s, other than `*a*`), plus
/// one per `a*b` prefix along the longest chain of nested ones (`/api/*/x` and
/// `/api/v1/*/y` nest: 2). Rules written for envoyproxy/ratelimit (a
/// trailing `*`) never come near it; a constant, not a setting, so that `sluice check`
/// agrees with every server on whether a file loads.
pub const MAX_WILDCARD_CHECKS: usize = 64;

/// A position in `wildcards`, or none.
const NONE: u32 = u32::MAX;

/// The patterns of one level, indexed by shape so that a lookup finds the first match in file
/// order with a few passes over the value, however many patterns there are. A pattern is its
/// literal segments between `*`s (empty middle segments dropped: `a**b` is `a*b`):
///
/// - `a*` (and `*` alone): a byte trie of the prefixes, walked along the value;
/// - `*a`: a trie of the reversed suffixes, walked back from the value's end;
/// - `a*b`: a reversed trie of the suffixes of the patterns that share each prefix, hung on
///   that prefix's node of the prefix trie and walked only when the walk reaches it;
/// - `*a*`: an Aho-Corasick automaton over the middles, each state knowing the first pattern
///   that ends there or at any shorter suffix of the text it stands for;
/// - anything else (`a*b*c`, ...): checked one by one, in file order, by [`Glob`].
///
/// Each finds the first pattern of its shape that matches; the earliest of those wins. A
/// walk stops where nothing below can come earlier in the file than what was found.
#[derive(Debug, Default)]
struct WildcardIndex {
    /// Prefixes of `a*` and `a*b` patterns; a node's `group` is the root in `suffixes` of
    /// the `a*b` patterns with that prefix.
    prefixes: Trie,
    /// Reversed suffixes: root 0 holds the `*a` patterns, every other root an `a*b` group.
    suffixes: Trie,
    /// The middles of `*a*` patterns.
    middles: Automaton,
    /// The other patterns, in file order.
    globs: Vec<(u32, Glob)>,
    /// The most passes over a value beyond the four fixed ones: [`MAX_WILDCARD_CHECKS`].
    checks: usize,
}

impl WildcardIndex {
    fn build(patterns: &[(String, Node)]) -> WildcardIndex {
        let mut prefixes = TrieBuilder::new();
        let mut suffixes = TrieBuilder::new();
        let mut middles = TrieBuilder::new();
        let mut group_of: HashMap<u32, u32> = HashMap::new();
        let mut globs = Vec::new();
        for (i, (p, _)) in patterns.iter().enumerate() {
            // Positions fit in u32: a rules file is at most 4 MiB (prescan.rs).
            let i = i as u32;
            let glob = Glob::new(p.as_bytes());
            match (&glob.prefix[..], &glob.middles[..], &glob.suffix[..]) {
                (prefix, [], []) => {
                    let at = prefixes.insert(0, prefix.iter().copied());
                    prefixes.mark(at, i);
                }
                ([], [], suffix) => {
                    let at = suffixes.insert(0, suffix.iter().rev().copied());
                    suffixes.mark(at, i);
                }
                (prefix, [], suffix) => {
                    let node = prefixes.insert(0, prefix.iter().copied());
                    prefixes.below(node, i);
                    let root = *group_of.entry(node).or_insert_with(|| suffixes.root());
                    let at = suffixes.insert(root, suffix.iter().rev().copied());
                    suffixes.mark(at, i);
                }
                ([], [middle], []) => {
                    let at = middles.insert(0, middle.iter().copied());
                    middles.mark(at, i);
                }
                _ => globs.push((i, glob)),
            }
        }
        let mut prefixes = prefixes.freeze();
        for (node, root) in group_of {
            prefixes.nodes[node as usize].group = root;
        }
        // The most `a*b` groups one walk of the prefix trie can reach: each is one pass.
        // Children always come after their parent (the builder appends), so one forward
        // sweep sees every parent first.
        let mut nested = vec![0usize; prefixes.nodes.len()];
        for node in 0..prefixes.nodes.len() {
            nested[node] += usize::from(prefixes.nodes[node].group != NONE);
            let (from, to) = prefixes.children(node as u32);
            for &child in &prefixes.targets[from..to] {
                nested[child as usize] = nested[node];
            }
        }
        let checks = globs.len() + nested.into_iter().max().unwrap_or(0);
        WildcardIndex {
            prefixes,
            suffixes: suffixes.freeze(),
            middles: Automaton::new(middles.freeze()),
            globs,
            checks,
        }
    }

    /// The position of the first pattern, in file order, that matches `value`.
    fn first(&self, value: &[u8]) -> Option<usize> {
        let mut best = NONE;
        // Prefixes, and the `a*b` groups hung on them.
        let t = &self.prefixes;
        let mut node = 0;
        best = best.min(t.nodes[0].here);
        for (i, &c) in value.iter().enumerate() {
            if t.nodes[node as usize].below >= best {
                break;
            }
            work::add(1);
            let Some(next) = t.child(node, c) else { break };
            node = next;
            best = best.min(t.nodes[node as usize].here);
            let root = t.nodes[node as usize].group;
            if root != NONE {
                // The suffix must not overlap the prefix.
                best = self.suffixes.walk_back(root, &value[i + 1..], best);
            }
        }
        best = self.suffixes.walk_back(0, value, best);
        best = self.middles.first(value, best);
        for (i, glob) in &self.globs {
            if *i >= best {
                break;
            }
            if glob.matches(value) {
                best = *i;
            }
        }
        (best != NONE).then_some(best as usize)
    }
}

/// A byte trie in flat arrays, possibly with several roots: each node's children are a run
/// of `labels` (sorted) and `targets`.
#[derive(Debug, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
    labels: Vec<u8>,
    targets: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct TrieNode {
    /// The node's children: `labels[start..start + len]`.
    start: u32,
    len: u32,
    /// The first pattern that ends at this node.
    here: u32,
    /// The first pattern at this node or below it (for `a*b` groups, including patterns
    /// whose suffixes hang elsewhere): a walk stops once it cannot beat what it has.
    below: u32,
    /// In the prefix trie, the root of this prefix's `a*b` group in the suffix trie.
    group: u32,
}

impl Trie {
    fn children(&self, node: u32) -> (usize, usize) {
        let n = &self.nodes[node as usize];
        (n.start as usize, (n.start + n.len) as usize)
    }

    /// The child of `node` by byte `c`. The labels are read sixteen at a time as one
    /// `u128` and searched without branches: a trie node's children are a handful of digits
    /// or letters, where a binary search mispredicts at every step.
    #[inline(always)]
    fn child(&self, node: u32, c: u8) -> Option<u32> {
        const ONES: u128 = u128::from_le_bytes([0x01; 16]);
        const HIGHS: u128 = u128::from_le_bytes([0x80; 16]);
        let n = &self.nodes[node as usize];
        let (start, len) = (n.start as usize, n.len as usize);
        let mut chunk = 0;
        while chunk < len {
            // `labels` has 16 bytes of padding at its end, so a chunk is always whole.
            let bytes: [u8; 16] = self.labels[start + chunk..start + chunk + 16]
                .try_into()
                .unwrap_or([0; 16]);
            // A zero byte of `x` is a label equal to `c`; the lowest flagged byte is always
            // a true zero (a false flag needs a borrow from a zero below it), and bytes past
            // this node's labels are masked off.
            let x = u128::from_le_bytes(bytes) ^ (ONES * u128::from(c));
            let mut flags = x.wrapping_sub(ONES) & !x & HIGHS;
            let valid = len - chunk;
            if valid < 16 {
                flags &= (1u128 << (8 * valid)) - 1;
            }
            if flags != 0 {
                let k = chunk + (flags.trailing_zeros() / 8) as usize;
                return Some(self.targets[start + k]);
            }
            chunk += 16;
        }
        None
    }

    /// Walks `value` from its end down from `root`: the first pattern whose (reversed)
    /// suffix the value ends with, if it comes before `best`.
    fn walk_back(&self, root: u32, value: &[u8], mut best: u32) -> u32 {
        let mut node = root;
        best = best.min(self.nodes[node as usize].here);
        for &c in value.iter().rev() {
            if self.nodes[node as usize].below >= best {
                break;
            }
            work::add(1);
            let Some(next) = self.child(node, c) else {
                break;
            };
            node = next;
            best = best.min(self.nodes[node as usize].here);
        }
        best
    }
}

/// A trie under construction: children unsorted, in a list per node.
struct TrieBuilder {
    children: Vec<Vec<(u8, u32)>>,
    here: Vec<u32>,
    below: Vec<u32>,
}

impl TrieBuilder {
    fn new() -> TrieBuilder {
        let mut t = TrieBuilder {
            children: Vec::new(),
            here: Vec::new(),
            below: Vec::new(),
        };
        t.root();
        t
    }

    /// A new root (node 0 is the first).
    fn root(&mut self) -> u32 {
        self.children.push(Vec::new());
        self.here.push(NONE);
        self.below.push(NONE);
        (self.children.len() - 1) as u32
    }

    /// The node reached from `from` by `bytes`, made as needed.
    fn insert(&mut self, from: u32, bytes: impl Iterator<Item = u8>) -> u32 {
        let mut node = from;
        for c in bytes {
            let found = self.children[node as usize]
                .iter()
                .find(|(l, _)| *l == c)
                .map(|&(_, t)| t);
            node = match found {
                Some(t) => t,
                None => {
                    let t = self.root();
                    self.children[node as usize].push((c, t));
                    t
                }
            };
        }
        node
    }

    /// Pattern `i` ends at `node`.
    fn mark(&mut self, node: u32, i: u32) {
        self.here[node as usize] = self.here[node as usize].min(i);
        self.below(node, i);
    }

    /// Pattern `i` is reached through `node`.
    fn below(&mut self, node: u32, i: u32) {
        self.below[node as usize] = self.below[node as usize].min(i);
    }

    fn freeze(self) -> Trie {
        // `below` gathers up the tree: children come after their parent, so walk backwards.
        let mut below = self.below;
        for node in (0..self.children.len()).rev() {
            for &(_, t) in &self.children[node] {
                below[node] = below[node].min(below[t as usize]);
            }
        }
        let mut t = Trie::default();
        for (node, mut children) in self.children.into_iter().enumerate() {
            children.sort_unstable();
            t.nodes.push(TrieNode {
                start: t.labels.len() as u32,
                len: children.len() as u32,
                here: self.here[node],
                below: below[node],
                group: NONE,
            });
            for (l, target) in children {
                t.labels.push(l);
                t.targets.push(target);
            }
        }
        // The padding `Trie::child` reads past the last node's labels.
        t.labels.extend([0; 16]);
        t
    }
}

/// Aho-Corasick over the middles of `*a*` patterns: one pass over a value finds the first
/// pattern whose middle it contains. `first[s]` is the first pattern ending at state `s`
/// or at any state on its chain of failure links, so nothing is enumerated per position.
#[derive(Debug, Default)]
struct Automaton {
    trie: Trie,
    fail: Vec<u32>,
    first: Vec<u32>,
}

impl Automaton {
    fn new(trie: Trie) -> Automaton {
        let n = trie.nodes.len();
        let mut fail = vec![0u32; n];
        let mut first: Vec<u32> = trie.nodes.iter().map(|n| n.here).collect();
        // Breadth first, so a node's failure target is done before the node.
        let mut queue = std::collections::VecDeque::new();
        if n > 0 {
            queue.push_back(0u32);
        }
        while let Some(node) = queue.pop_front() {
            let (from, to) = trie.children(node);
            for k in from..to {
                let (c, child) = (trie.labels[k], trie.targets[k]);
                fail[child as usize] = if node == 0 {
                    0
                } else {
                    let mut f = fail[node as usize];
                    loop {
                        if let Some(t) = trie.child(f, c) {
                            break t;
                        }
                        if f == 0 {
                            break 0;
                        }
                        f = fail[f as usize];
                    }
                };
                first[child as usize] =
                    first[child as usize].min(first[fail[child as usize] as usize]);
                queue.push_back(child);
            }
        }
        Automaton { trie, fail, first }
    }

    /// The first `*a*` pattern, in file order, whose middle `value` contains, if it comes
    /// before `best`.
    fn first(&self, value: &[u8], mut best: u32) -> u32 {
        if self.trie.nodes.is_empty() || self.trie.nodes[0].below >= best {
            return best;
        }
        let mut state = 0u32;
        for &c in value {
            // Each byte moves down once; failure links only move up, so at most twice the
            // value's length in steps.
            loop {
                work::add(1);
                if let Some(t) = self.trie.child(state, c) {
                    state = t;
                    break;
                }
                if state == 0 {
                    break;
                }
                state = self.fail[state as usize];
            }
            best = best.min(self.first[state as usize]);
            if self.trie.nodes[0].below >= best {
                break;
            }
        }
        best
    }
}

/// A pattern as its literal segments: `prefix*m1*m2*...*suffix`, empty middles dropped.
#[derive(Debug)]
struct Glob {
    prefix: Box<[u8]>,
    middles: Vec<Box<[u8]>>,
    suffix: Box<[u8]>,
    finders: Vec<memchr::memmem::Finder<'static>>,
}

impl Glob {
    /// `pattern` holds at least one `*`.
    fn new(pattern: &[u8]) -> Glob {
        let mut segments: Vec<&[u8]> = pattern.split(|&c| c == b'*').collect();
        let suffix = segments.pop().unwrap_or_default().into();
        let prefix: Box<[u8]> = if segments.is_empty() {
            Box::default()
        } else {
            segments.remove(0).into()
        };
        let middles: Vec<Box<[u8]>> = segments
            .into_iter()
            .filter(|m| !m.is_empty())
            .map(Into::into)
            .collect();
        let finders = middles
            .iter()
            .map(|m| memchr::memmem::Finder::new(m).into_owned())
            .collect();
        Glob {
            prefix,
            middles,
            suffix,
            finders,
        }
    }

    /// Whether `value` matches: the prefix and suffix anchored, without overlapping, and
    /// each middle at its leftmost place after the one before. Taking the leftmost place
    /// is never wrong with `*` the only wildcard (any later place leaves less room for
    /// the rest), so this is one pass: O(value + pattern).
    fn matches(&self, value: &[u8]) -> bool {
        let (p, s) = (self.prefix.len(), self.suffix.len());
        if value.len() < p + s || !value.starts_with(&self.prefix) || !value.ends_with(&self.suffix)
        {
            return false;
        }
        work::add((p + s) as u64);
        let mut rest = &value[p..value.len() - s];
        for f in &self.finders {
            let Some(at) = f.find(rest) else {
                work::add(rest.len() as u64);
                return false;
            };
            let end = at + f.needle().len();
            work::add(end as u64);
            rest = &rest[end..];
        }
        true
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

/// The bytes of request values a lookup examines, counted in tests only: the bound on a
/// lookup's work is asserted on this count, not on a clock.
pub(crate) mod work {
    #[cfg(test)]
    thread_local!(static BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });

    /// Counts `n` bytes examined (a no-op outside tests).
    #[inline(always)]
    pub(crate) fn add(n: u64) {
        #[cfg(test)]
        BYTES.with(|b| b.set(b.get() + n));
        #[cfg(not(test))]
        let _ = n;
    }

    /// The count so far on this thread, reset to zero.
    #[cfg(test)]
    pub(crate) fn take() -> u64 {
        BYTES.with(|b| b.replace(0))
    }
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
}
