//! The bounded in-memory table of counters: one [`Entity`] per (rule, descriptor values),
//! held in a moka cache with a maximum entry count, an idle timeout and an optional TTL.
//!
//! An entity is never expired while its windows still matter: its idle lifetime is at least
//! twice its longest window, so expiry cannot reset a live counter (only capacity eviction can,
//! which is counted). Each entity has its own mutex, held only for the few nanoseconds of a
//! decision and never across an `.await`, so requests for one entity are exact under
//! concurrency while requests for different entities never contend.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;
use moka::Expiry;
use parking_lot::Mutex;

use crate::core::{Limit, LimitState};

/// Counters of one entity (rule + descriptor values): one window state per limit of its rule.
#[derive(Debug)]
pub struct Entity {
    /// The entity's identity (see `rules::Match::entity`); names its Redis keys.
    pub key: u128,
    /// The rule's limits (fixed for an entity: a rule's identity includes its limits).
    pub limits: Box<[Limit]>,
    /// Counters and sync bookkeeping, behind one lock so a decision and a sync never race.
    pub state: Mutex<EntityState>,
    /// The rule's longest window: the entity is kept at least twice this long when idle.
    longest_window: Duration,
}

/// The mutable part of an [`Entity`].
#[derive(Debug, Default)]
pub struct EntityState {
    /// One state per limit, in the rule's order.
    pub states: Vec<LimitState>,
    /// In its shard's sync queue (or in a sync in flight): at most once.
    pub queued: bool,
    /// Syncs of this entity in flight: at most one, but for burst reads (two, the second
    /// started while the first is under way: `global/shard.rs`).
    pub in_flight: u8,
    /// When the last sync started (Unix ms).
    pub last_sync_ms: u64,
}

/// Limits of the entity table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Most entities held; the least recently used are evicted past it.
    pub max_entries: u64,
    /// An entity unused this long is dropped (but never before twice its longest window).
    pub idle_timeout: Duration,
    /// Upper bound on an entity's lifetime since it was last used, if set. Setting it below
    /// twice a rule's window trades accuracy for memory.
    pub ttl: Option<Duration>,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings {
            max_entries: 1_000_000,
            idle_timeout: Duration::from_secs(60),
            ttl: None,
        }
    }
}

struct EntityExpiry {
    idle: Duration,
    ttl: Option<Duration>,
}

impl EntityExpiry {
    fn lifetime(&self, e: &Entity) -> Option<Duration> {
        let keep = self.idle.max(e.longest_window * 2);
        Some(self.ttl.map_or(keep, |t| keep.min(t)))
    }
}

impl Expiry<u128, Arc<Entity>> for EntityExpiry {
    fn expire_after_create(
        &self,
        _: &u128,
        e: &Arc<Entity>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        self.lifetime(e)
    }

    fn expire_after_read(
        &self,
        _: &u128,
        e: &Arc<Entity>,
        _: std::time::Instant,
        _: Option<Duration>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        self.lifetime(e)
    }
}

/// The entity table.
#[derive(Clone)]
pub struct EntityCache {
    cache: Cache<u128, Arc<Entity>>,
}

impl std::fmt::Debug for EntityCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntityCache")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

impl EntityCache {
    /// An empty table with these limits.
    pub fn new(settings: CacheSettings) -> Self {
        let cache = Cache::builder()
            .max_capacity(settings.max_entries)
            .expire_after(EntityExpiry {
                idle: settings.idle_timeout,
                ttl: settings.ttl,
            })
            .build();
        EntityCache { cache }
    }

    /// The entity `key`, created with zeroed windows for `limits` if absent. `limits` is
    /// called only when the entity is created, so a hit costs no allocation. The flag says
    /// whether the entity already existed.
    pub fn get_or_create(
        &self,
        key: u128,
        limits: impl FnOnce() -> Box<[Limit]>,
    ) -> (Arc<Entity>, bool) {
        let entry = self.cache.entry(key).or_insert_with(|| {
            let limits = limits();
            let longest = limits.iter().map(|l| l.window_ms).max().unwrap_or(1000);
            Arc::new(Entity {
                key,
                state: Mutex::new(EntityState {
                    states: limits.iter().map(LimitState::new).collect(),
                    ..EntityState::default()
                }),
                limits,
                longest_window: Duration::from_millis(longest),
            })
        });
        let fresh = entry.is_fresh();
        (entry.into_value(), !fresh)
    }

    /// How many entities are held (approximate; moka counts lazily).
    pub fn len(&self) -> u64 {
        self.cache.entry_count()
    }

    /// Whether no entity is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_key_returns_the_same_entity() {
        let c = EntityCache::new(CacheSettings::default());
        let l = Limit {
            requests_per_unit: 1,
            window_ms: 1000,
            algorithm: crate::core::Algorithm::SlidingWindow,
        };
        let (a, hit_a) = c.get_or_create(7, || Box::new([l, l]));
        let (b, hit_b) = c.get_or_create(7, || Box::new([l, l]));
        assert!(!hit_a && hit_b);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.state.lock().states.len(), 2);
    }

    #[test]
    fn lifetime_covers_two_windows() {
        let x = EntityExpiry {
            idle: Duration::from_secs(60),
            ttl: None,
        };
        let e = Entity {
            key: 0,
            limits: Box::new([]),
            state: Mutex::new(EntityState::default()),
            longest_window: Duration::from_secs(3600),
        };
        assert_eq!(x.lifetime(&e), Some(Duration::from_secs(7200)));
        let capped = EntityExpiry {
            ttl: Some(Duration::from_secs(100)),
            ..x
        };
        assert_eq!(capped.lifetime(&e), Some(Duration::from_secs(100)));
    }
}
