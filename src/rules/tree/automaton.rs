//! Aho-Corasick over the middles of `*a*` patterns.

use super::trie::Trie;
use super::work;

/// Aho-Corasick over the middles of `*a*` patterns: one pass over a value finds the first
/// pattern whose middle it contains. `first[s]` is the first pattern ending at state `s`
/// or at any state on its chain of failure links, so nothing is enumerated per position.
#[derive(Debug, Default)]
pub(super) struct Automaton {
    trie: Trie,
    fail: Vec<u32>,
    first: Vec<u32>,
}

impl Automaton {
    pub(super) fn new(trie: Trie) -> Automaton {
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
    pub(super) fn first(&self, value: &[u8], mut best: u32) -> u32 {
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
