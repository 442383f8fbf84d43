//! A byte trie in flat arrays, and the builder that makes it.

use super::work;

/// A position in `wildcards`, or none.
pub(super) const NONE: u32 = u32::MAX;

/// A byte trie in flat arrays, possibly with several roots: each node's children are a run
/// of `labels` (sorted) and `targets`.
#[derive(Debug, Default)]
pub(super) struct Trie {
    pub(super) nodes: Vec<TrieNode>,
    pub(super) labels: Vec<u8>,
    pub(super) targets: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct TrieNode {
    /// The node's children: `labels[start..start + len]`.
    start: u32,
    len: u32,
    /// The first pattern that ends at this node.
    pub(super) here: u32,
    /// The first pattern at this node or below it (for `a*b` groups, including patterns
    /// whose suffixes hang elsewhere): a walk stops once it cannot beat what it has.
    pub(super) below: u32,
    /// In the prefix trie, the root of this prefix's `a*b` group in the suffix trie.
    pub(super) group: u32,
}

impl Trie {
    pub(super) fn children(&self, node: u32) -> (usize, usize) {
        let n = &self.nodes[node as usize];
        (n.start as usize, (n.start + n.len) as usize)
    }

    /// The child of `node` by byte `c`. The labels are read sixteen at a time as one
    /// `u128` and searched without branches: a trie node's children are a handful of digits
    /// or letters, where a binary search mispredicts at every step.
    #[inline(always)]
    pub(super) fn child(&self, node: u32, c: u8) -> Option<u32> {
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
    pub(super) fn walk_back(&self, root: u32, value: &[u8], mut best: u32) -> u32 {
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
pub(super) struct TrieBuilder {
    children: Vec<Vec<(u8, u32)>>,
    here: Vec<u32>,
    below: Vec<u32>,
}

impl TrieBuilder {
    pub(super) fn new() -> TrieBuilder {
        let mut t = TrieBuilder {
            children: Vec::new(),
            here: Vec::new(),
            below: Vec::new(),
        };
        t.root();
        t
    }

    /// A new root (node 0 is the first).
    pub(super) fn root(&mut self) -> u32 {
        self.children.push(Vec::new());
        self.here.push(NONE);
        self.below.push(NONE);
        (self.children.len() - 1) as u32
    }

    /// The node reached from `from` by `bytes`, made as needed.
    pub(super) fn insert(&mut self, from: u32, bytes: impl Iterator<Item = u8>) -> u32 {
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
    pub(super) fn mark(&mut self, node: u32, i: u32) {
        self.here[node as usize] = self.here[node as usize].min(i);
        self.below(node, i);
    }

    /// Pattern `i` is reached through `node`.
    pub(super) fn below(&mut self, node: u32, i: u32) {
        self.below[node as usize] = self.below[node as usize].min(i);
    }

    pub(super) fn freeze(self) -> Trie {
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
