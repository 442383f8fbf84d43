//! Freeing the limit sets nothing uses any more: a rule's counts and limits are interned
//! once per rule id and limit list (`LimitSets`), and without this a rule removed by a reload,
//! or a limit a request supplied once, kept its set for good (the rules of every reload of a
//! long-lived xDS stream, or any client making up limits, would grow it without bound).
//!
//! A set is in use while a rule set in force holds its counts (the compiled rules keep an
//! `Arc` of each rule's, so a request in flight on an older rule set keeps them too) or a
//! record of the table is of it (`tracked`). Each sweep (once a second) looks for sets
//! neither holds, under the read lock, and frees them under the write lock, checking again:
//! their counts are dropped (their `/top` candidates' bytes given back first), their limits
//! too, and their ids are used again. Looking a set up and taking it (counting a new record
//! in, or handing its counts out) happen under one hold of the lock, so a set is never freed
//! between the two.

use std::collections::HashSet;
use std::sync::Arc;

use super::{EntityTable, LimitSets, RuleCounts};
use crate::core::limit::Limit;

impl LimitSets {
    /// Whether nothing uses set `id` (not freed already): no compiled rules hold its counts,
    /// and no record is of it.
    fn unused(&self, id: usize) -> bool {
        let counts = &self.counts[id];
        Arc::strong_count(counts) == 1 && counts.tracked() == 0
    }

    /// The ids of the sets nothing uses.
    fn unused_ids(&self) -> HashSet<u32> {
        let free: HashSet<u32> = self.free.iter().copied().collect();
        (0..self.sets.len() as u32)
            .filter(|id| !free.contains(id) && self.unused(*id as usize))
            .collect()
    }
}

impl EntityTable {
    /// Calls `f` on the set of (`rule`, `limits`), interned now if new, under one hold of the
    /// sets' lock.
    pub(super) fn with_set<R>(
        &self,
        rule: u64,
        limits: &[Limit],
        f: impl FnOnce(&LimitSets, u32) -> R,
    ) -> R {
        let f = {
            let sets = self.inner.sets.read();
            match sets.ids.get(&(rule, limits.into())).copied() {
                Some(id) => return f(&sets, id),
                None => f,
            }
        };
        let mut sets = self.inner.sets.write();
        let id = sets.intern(rule, limits, &self.inner.candidate_bytes);
        f(&sets, id)
    }

    /// The set of (`rule`, `limits`), interned now if new, with one more record counted in
    /// its rule's `tracked`.
    pub(super) fn set_tracked(&self, rule: u64, limits: &[Limit]) -> u32 {
        self.with_set(rule, limits, |sets, id| {
            Self::track(sets, id, 1);
            id
        })
    }

    /// Frees the sets nothing uses (see the module docs). Returns how many.
    pub(super) fn release_unused_sets(&self) -> usize {
        if self.inner.sets.read().unused_ids().is_empty() {
            return 0;
        }
        let mut sets = self.inner.sets.write();
        let freed = sets.unused_ids();
        sets.ids.retain(|_, id| !freed.contains(id));
        for &id in &freed {
            let slot = id as usize;
            sets.counts[slot].candidates.forget(|_| true);
            sets.sets[slot] = Arc::from(Vec::new());
            sets.counts[slot] = Arc::new(RuleCounts::new(self.inner.candidate_bytes.clone()));
            sets.free.push(id);
        }
        freed.len()
    }

    /// How many limit sets the table holds (freed ones aside).
    pub fn limit_sets(&self) -> usize {
        self.inner.sets.read().ids.len()
    }
}
