//! What the store holds of one node's part of a window counter ([`Held`]), and how it takes
//! in a statement: the arithmetic of `global/redis/sync.lua`, once in Rust, for its twin
//! (`global/memory/mod.rs`) and the core's tests.
//!
//! A statement gives the node's hits and refunds so far ([`Part`]), both only ever growing,
//! so the store keeps the larger of what it holds and what it is told: a resent, late or
//! reordered call counts nothing twice. But the refunds a node states are those it took off
//! its own view of the count, and two nodes may take the same hits off their views (a
//! release retried through another replica, two settles of one reservation): summed, they
//! would take the count below zero, and the fleet would then admit the limit again on top
//! of what it holds. So a refund is applied when it first reaches the store, and only as far
//! as the count holds hits then (this node's and the others', this call's hits taken in
//! first); the rest is *kept out* and never applied — it gave back what was not taken.
//! Deciding it once, on arrival, keeps the statement idempotent: a later call stating the
//! same refunds finds them held, whatever the count is by then.

use super::Part;

/// One node's part of a counter as the store holds it: the fields `<id>` (hits), `<id>-`
/// (minus the refunds stated) and `<id>+` (the refunds kept out) of `sync.lua`'s hash, whose
/// sum over every field is the count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// The most hits the node stated.
    pub hits: u64,
    /// The most refunds the node stated.
    pub refunds: u64,
    /// Those of the refunds not applied: past the count when they reached the store.
    pub kept: u64,
}

impl Held {
    /// The node's net part of the count: its hits less the refunds applied.
    pub fn net(&self) -> i64 {
        self.hits as i64 - self.applied() as i64
    }

    /// The refunds applied to the count.
    pub fn applied(&self) -> u64 {
        self.refunds - self.kept
    }

    /// Takes in `said`, the other parts of the counter netting `others`: the hits are kept
    /// at the larger of held and stated; of the refunds stated beyond those held, as many are
    /// applied as the count then holds (the hits just stated included, never below zero),
    /// and the rest kept out.
    pub fn state(&mut self, said: Part, others: i64) {
        self.hits = self.hits.max(said.hits);
        if said.refunds > self.refunds {
            let new = said.refunds - self.refunds;
            let count = others.saturating_add(self.net()).max(0) as u64;
            self.kept += new - new.min(count);
            self.refunds = said.refunds;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(hits: u64, refunds: u64) -> Part {
        Part { hits, refunds }
    }

    #[test]
    fn a_refund_applies_only_as_far_as_the_count_holds() {
        // Two nodes held 5 each; each gives back 10: the first takes the count to 0, the
        // second finds nothing left to give back.
        let (mut a, mut b) = (Held::default(), Held::default());
        a.state(said(5, 0), 0);
        b.state(said(5, 0), a.net());
        a.state(said(5, 10), b.net());
        assert_eq!((a.net(), a.kept), (-5, 0));
        b.state(said(5, 10), a.net());
        assert_eq!((b.net(), b.kept, a.net() + b.net()), (5, 10, 0));
    }

    #[test]
    fn a_resent_or_stale_statement_changes_nothing() {
        let mut a = Held::default();
        a.state(said(3, 8), 2);
        let held = a;
        assert_eq!((held.net(), held.kept), (-2, 3));
        // The same statement again, or an older one, once the count has grown.
        for old in [said(3, 8), said(3, 2), said(0, 0)] {
            a.state(old, 100);
            assert_eq!(a, held);
        }
        // Newer refunds are judged on the count they find.
        a.state(said(3, 10), 100);
        assert_eq!((a.net(), a.kept), (-4, 3));
    }

    #[test]
    fn hits_stated_with_the_refunds_count_before_them() {
        // 4 hits and 4 refunds first reach the store in one call (the earlier call lost):
        // all four come back, the node's own hits counting.
        let mut a = Held::default();
        a.state(said(4, 4), 0);
        assert_eq!((a.net(), a.kept), (0, 0));
        // A count already below zero (the previous script's data) gives nothing back.
        let mut b = Held::default();
        b.state(said(0, 3), -10);
        assert_eq!((b.net(), b.kept), (0, 3));
    }
}
