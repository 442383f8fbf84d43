//! A bucket id (an unordered `map<string, string>`, as Envoy's rate-limit quota filter sends
//! it) resolved to a rule through the same descriptor tree as `ShouldRateLimit`: the search
//! for the order in which the map's entries walk the tree.

use super::tree::{Kind, Node};
use super::{Match, RuleSet, Walk};

/// The most entries a bucket id may have: the default of `MAX_DESCRIPTOR_ENTRIES`, so a
/// bucket reaches what a default `ShouldRateLimit` descriptor reaches. A rules file could nest
/// deeper (up to 62 levels within [`prescan::MAX_DEPTH`](super::prescan::MAX_DEPTH)), but no
/// real rule does, and a constant keeps the search's state in a fixed array and a `u32` bit
/// set: no allocation per bucket. A longer map has no rule.
pub const MAX_BUCKET_ENTRIES: usize = 32;

/// The most value lookups one bucket's search may make (a lookup costs a few passes over the
/// value). A map whose keys the tree names in one order only costs one lookup per entry at
/// each level: at most 32 + 31 + ... + 1 = 528 for the longest map when every level names
/// every remaining key, and a handful for real rules (one key per level: one per entry). The
/// budget leaves room for several dead ends; it runs out only on a tree built so that the
/// map's orders branch at every level (6 keys nested in all their orders take 1,956), and then
/// the bucket has no rule, deterministically.
pub const MAX_BUCKET_LOOKUPS: usize = 1024;

// The search's bit set of used entries.
const _: () = assert!(MAX_BUCKET_ENTRIES <= u32::BITS as usize);

impl RuleSet {
    /// The rule a bucket id resolves to, if any, and its counter. Allocation-free.
    ///
    /// The map's entries are a descriptor's entries in an order the tree gives: at each level,
    /// an entry whose key the level names selects its node as in [`RuleSet::find`] (exact
    /// value, then the first wildcard that matches, then key-only), and the match must use
    /// every entry, its last one selecting a node with a limit (or a value of the level's
    /// `overrides`, as in `find`). The counter is the one `find` computes for the descriptor
    /// in that order, so both protocols count in one counter.
    ///
    /// When several entries' keys are named at one level, they are tried by precedence of
    /// the node they select (exact before wildcard before key-only), then by key (bytewise);
    /// an order that dead-ends is abandoned for the next (a depth-first search), and the first
    /// complete match in that order wins. So `{tenant: acme, method: GET}` finds the rule of
    /// `tenant → method` even where the top level also names `method` alone.
    ///
    /// No match: an unknown domain, an empty map, a map of more than [`MAX_BUCKET_ENTRIES`]
    /// entries, an entry the tree does not use, or a search past [`MAX_BUCKET_LOOKUPS`]
    /// lookups. The map's keys are distinct (it is a map).
    pub fn find_bucket<'m, K, V>(
        &self,
        domain: &str,
        bucket: impl IntoIterator<Item = (&'m K, &'m V)>,
    ) -> Option<Match<'_>>
    where
        K: AsRef<str> + ?Sized + 'm,
        V: AsRef<str> + ?Sized + 'm,
    {
        let mut entries = [("", ""); MAX_BUCKET_ENTRIES];
        let mut n = 0;
        for (k, v) in bucket {
            if n == MAX_BUCKET_ENTRIES {
                return None;
            }
            entries[n] = (k.as_ref(), v.as_ref());
            n += 1;
        }
        if n == 0 {
            return None;
        }
        // Sorted, so that ties go by key whatever order the map iterates in.
        let entries = &mut entries[..n];
        entries.sort_unstable();
        let walk = self.walk(domain)?;
        let mut search = Search {
            set: self,
            entries,
            lookups: MAX_BUCKET_LOOKUPS,
            exhausted: false,
        };
        search.down(walk, 0)
    }
}

/// A bucket's depth-first search over the orders of its entries. Each call of
/// [`Search::down`] is at a distinct node of the tree (a node's path names the entries used
/// to reach it), so nothing is visited twice; the lookup budget bounds the rest.
struct Search<'s, 'e> {
    set: &'s RuleSet,
    /// The map's entries, sorted by key.
    entries: &'e [(&'e str, &'e str)],
    /// Lookups left.
    lookups: usize,
    /// The budget ran out: the search answers no match, and stops at once. (Every later
    /// step would find nothing anyway, since it must look up before it can match, but the
    /// steps above would go on trying their other candidates.)
    exhausted: bool,
}

impl<'s> Search<'s, '_> {
    /// The first complete match below `walk`, which has used the entries in `used`.
    fn down(&mut self, walk: Walk<'s>, used: u32) -> Option<Match<'s>> {
        let last = used.count_ones() as usize + 1 == self.entries.len();
        // The entries this level selects a node for, each with the node.
        let mut next: [(usize, Option<&'s Node>); MAX_BUCKET_ENTRIES] =
            [(0, None); MAX_BUCKET_ENTRIES];
        let mut found = 0;
        for (i, &(key, value)) in self.entries.iter().enumerate() {
            if used & (1 << i) != 0 || !walk.level.contains_key(key) {
                continue;
            }
            if self.lookups == 0 {
                self.exhausted = true;
                return None;
            }
            self.lookups -= 1;
            if last {
                // The one entry left ends the descriptor, as in `find`.
                return self.set.matched(walk, key, value);
            }
            if let Some(node) = walk.select(key, value) {
                next[found] = (i, Some(node));
                found += 1;
            }
        }
        let next = &mut next[..found];
        next.sort_unstable_by_key(|&(i, node)| (node.map(|n| precedence(n.kind)), i));
        for &(i, node) in next.iter() {
            let Some(node) = node else { continue };
            let mut below = walk.clone();
            below.enter(node, self.entries[i].1);
            let m = self.down(below, used | 1 << i);
            if self.exhausted {
                return None;
            }
            if m.is_some() {
                return m;
            }
        }
        None
    }
}

/// The order in which nodes of different keys are tried: as within one key.
fn precedence(kind: Kind) -> u8 {
    match kind {
        Kind::Exact => 0,
        Kind::Wildcard => 1,
        Kind::AnyValue => 2,
    }
}

#[cfg(test)]
#[path = "bucket_tests.rs"]
mod tests;
