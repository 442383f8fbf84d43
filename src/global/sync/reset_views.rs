//! What a shard task does with the keys its reset log names (`reset_log.rs`): clears this
//! replica's view of them. Apart from the log, so that the store's types (`store.rs`), which
//! name the log's, do not reach the queues through it.

use super::queue::SyncQueues;
use crate::core::table::EntityTable;

/// Clears this replica's view of `entities`, reset through another replica (those it does
/// not hold are no matter): each limit forgets the fleet's count as last read, keeping its
/// own hits not sent yet (`LimitState::forget`, as `rls/reset.rs` does on the replica
/// asked), and the entity is queued on shard `index`, so the next tick reads the store's.
///
/// [`LimitState::forget`]: crate::core::LimitState::forget
pub(super) fn clear_views(
    table: &EntityTable,
    queues: &SyncQueues,
    index: usize,
    entities: &[u128],
) {
    for &key in entities {
        // The log is the shard's: a key routed elsewhere without `per_second` is a
        // per-second rule's.
        let per_second = queues.shard_of(key, false) != index;
        table.get(key, |e| {
            for st in e.state.states.iter_mut() {
                st.forget(true);
            }
            queues.mark_dirty(key, e.state, per_second);
        });
    }
}
