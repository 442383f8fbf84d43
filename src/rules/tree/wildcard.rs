//! The index of one level's wildcard patterns by shape: the first match in file order in a
//! few passes over a value.

use std::collections::HashMap;

use super::automaton::Automaton;
use super::glob::Glob;
use super::trie::{Trie, TrieBuilder, NONE};
use super::{work, Node};

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
pub(super) struct WildcardIndex {
    /// Prefixes of `a*` and `a*b` patterns; a node's `group` is the root in `suffixes` of
    /// the `a*b` patterns with that prefix.
    prefixes: Trie,
    /// Reversed suffixes: root 0 holds the `*a` patterns, every other root an `a*b` group.
    suffixes: Trie,
    /// The middles of `*a*` patterns.
    middles: Automaton,
    /// The other patterns, in file order.
    globs: Vec<(u32, Glob)>,
    /// The most passes over a value beyond the four fixed ones: [`MAX_WILDCARD_CHECKS`](super::MAX_WILDCARD_CHECKS).
    pub(super) checks: usize,
}

impl WildcardIndex {
    pub(super) fn build(patterns: &[(String, Node)]) -> WildcardIndex {
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
    pub(super) fn first(&self, value: &[u8]) -> Option<usize> {
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
