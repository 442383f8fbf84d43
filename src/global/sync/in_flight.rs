//! The entities of a shard's store call in progress ([`InFlight`]), and how a call that got
//! no reply is undone ([`put_back`]): their deltas go back to pending, so no hit is lost or
//! left in flight whether the call failed, panicked or was aborted.

use std::sync::Arc;

use super::queue::SyncQueues;
use crate::core::table::EntityTable;
use crate::core::{Limit, Plan};

/// An entity of a call: its limits and what the call sends of each.
pub(super) struct Planned {
    pub key: u128,
    pub limits: Arc<[Limit]>,
    pub plans: Vec<Plan>,
}

/// Undoes the beginning of a sync that got no reply: the deltas go back to pending. Returns
/// the entities to requeue: those no other sync in flight holds.
pub(super) fn put_back(table: &EntityTable, planned: Vec<Planned>) -> Vec<u128> {
    planned
        .into_iter()
        .filter_map(|p| {
            let held = table.get(p.key, |e| {
                for (i, plan) in p.plans.iter().enumerate() {
                    e.state.states[i].fail_sync(plan);
                }
                e.state.in_flight -= 1;
                e.state.in_flight > 0
            });
            (held == Some(false)).then_some(p.key)
        })
        .collect()
}

/// The entities of a store call in progress; dropped before the reply is settled (the call
/// panicked, or the task was aborted mid-call), it puts their deltas back and requeues them,
/// so they are neither lost nor stuck in flight.
pub(super) struct InFlight<'a> {
    pub planned: Vec<Planned>,
    pub queues: &'a SyncQueues,
    pub table: &'a EntityTable,
    pub index: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.planned.is_empty() {
            let requeue = put_back(self.table, std::mem::take(&mut self.planned));
            self.queues.requeue(self.index, requeue);
        }
    }
}
