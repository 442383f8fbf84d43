//! Counter identity: the byte encodings behind a rule's id and an entity's key, which name the
//! counters in memory and in Redis. They are part of the wire contract between versions: a
//! replica of another version, or this one after a refactor, must compute the same keys, or a
//! rolling upgrade silently resets every counter. So the encodings are explicit bytes (never a
//! `Debug` rendering), documented in ARCHITECTURE.md ("Counter identity") and pinned by tests.
//!
//! - **Rule id** = XXH3-64 (seed 0) of:
//!   `b"sluice.rule.v1"`, then the rule's composite key (`domain.key_value.key2`, the
//!   reference's stats key) as `u32 LE length ‖ UTF-8 bytes`, then `unlimited` as one byte
//!   (0/1), then the number of limits as one byte, then per limit:
//!   `algorithm tag (u8) ‖ requests_per_unit (u32 LE) ‖ window_ms (u64 LE)`, with tags
//!   0 = sliding window, 1 = fixed window, 2 = token bucket (followed by its `burst`, u32
//!   LE), 3 = concurrency. A new algorithm gets a new tag and may append fields of its own after these;
//!   existing rules keep their ids.
//! - **Entity key** = XXH3-128 (seed 0), streamed over: for each request value at a key-only
//!   or wildcard level without `share_threshold`, `u64 LE length ‖ bytes` (length-prefixed so
//!   `("ab","c")` and `("a","bc")` differ), then the rule id as `u64 LE`.
//!
//! A rules file's per-value `overrides` (`rules/compile/overrides.rs`) add no encoding: each
//! is compiled to the rule a descriptor for its value alone would be (its composite key
//! `domain.key_value`), and its entity key leaves that value out, as an exact level does, so
//! it is that descriptor's counter. Its own rule id keeps it apart from the rule's counters,
//! and a changed override limit names a new counter, as a changed rule does.
//!
//! - **Override entity key** (a request's own `limit`) = XXH3-128 (seed 0) of
//!   `b"override\0" ‖ the descriptor's composite key (UTF-8, no length) ‖
//!   requests_per_unit (u32 LE) ‖ unit seconds (u64 LE)`.
//!
//! Redis keys are `{prefix}sluice:v2:{<entity key, 32 lowercase hex digits>}:<limit index>:<epoch>`,
//! each a hash with one field per replica (`global/redis/sync.rs`). The `v2` names the data model:
//! version 1 (no version segment) held plain `INCRBY` strings, and a new data model takes new
//! key names so that a rolling upgrade never sends a hash command to an old string
//! (`WRONGTYPE`). Upgrading from version 1 therefore starts every counter afresh, once.
//! Exact rules' counters are plain `INCRBY` strings under
//! `{prefix}sluice:x:{<entity key>}:<limit index>:<epoch>` (`global/redis/exact.rs`), so they
//! never collide with the sync's. `exact` is not encoded in the rule id.

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::core::{Algorithm, Limit};

const RULE_MAGIC: &[u8] = b"sluice.rule.v1";

/// The stable id of a rule: see the module docs for the encoding.
pub fn rule_id(composite_key: &str, unlimited: bool, limits: &[Limit]) -> u64 {
    let mut bytes = Vec::with_capacity(RULE_MAGIC.len() + composite_key.len() + 16 * limits.len());
    bytes.extend_from_slice(RULE_MAGIC);
    // Composite keys are bounded by the rules file size, far below 4 GiB.
    bytes.extend_from_slice(&(composite_key.len() as u32).to_le_bytes());
    bytes.extend_from_slice(composite_key.as_bytes());
    bytes.push(u8::from(unlimited));
    bytes.push(limits.len().min(255) as u8);
    for l in limits {
        bytes.push(algorithm_tag(l.algorithm));
        bytes.extend_from_slice(&l.requests_per_unit.to_le_bytes());
        bytes.extend_from_slice(&l.window_ms.to_le_bytes());
        if let Algorithm::TokenBucket { burst } = l.algorithm {
            bytes.extend_from_slice(&burst.to_le_bytes());
        }
    }
    xxh3_64(&bytes)
}

fn algorithm_tag(a: Algorithm) -> u8 {
    match a {
        Algorithm::SlidingWindow => 0,
        Algorithm::FixedWindow => 1,
        Algorithm::TokenBucket { .. } => 2,
        Algorithm::Concurrency => 3,
    }
}

/// Builds an entity key from the request values that distinguish counters, then the rule.
/// Allocation-free: it streams into the hasher.
#[derive(Clone, Default)]
pub struct EntityKey(Xxh3);

impl std::fmt::Debug for EntityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntityKey")
    }
}

impl EntityKey {
    /// A key with no values yet.
    pub fn new() -> Self {
        EntityKey(Xxh3::new())
    }

    /// Adds a request value that gets a counter of its own.
    pub fn value(&mut self, value: &str) {
        self.0.update(&(value.len() as u64).to_le_bytes());
        self.0.update(value.as_bytes());
    }

    /// The entity key of these values under the rule `rule_id`.
    pub fn finish(mut self, rule_id: u64) -> u128 {
        self.0.update(&rule_id.to_le_bytes());
        self.0.digest128()
    }
}

/// The entity key of a request-supplied limit override on `composite_key`: see the module
/// docs for the encoding.
pub fn override_entity(composite_key: &str, requests_per_unit: u32, unit_seconds: u64) -> u128 {
    let mut h = Xxh3::new();
    h.update(b"override\0");
    h.update(composite_key.as_bytes());
    h.update(&requests_per_unit.to_le_bytes());
    h.update(&unit_seconds.to_le_bytes());
    h.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Limit = Limit {
        requests_per_unit: 10,
        window_ms: 60_000,
        algorithm: Algorithm::SlidingWindow,
    };

    // These constants are the contract: if one changes, every deployed counter resets on
    // upgrade. Change them only with a new encoding version and a note in docs/global.md. They
    // were computed from the documented encoding by an independent implementation (Python's
    // `xxhash` package), not by this code.
    #[test]
    fn rule_ids_are_pinned() {
        assert_eq!(rule_id("edge.ip", false, &[MINUTE]), 0x5db8_3418_3344_c7c1);
        let fixed = Limit {
            algorithm: Algorithm::FixedWindow,
            ..MINUTE
        };
        assert_eq!(rule_id("edge.ip", false, &[fixed]), 0xa78f_139f_7ca4_8bb1);
        assert_eq!(rule_id("edge.ip", true, &[]), 0xa465_2c17_1cc0_fd05);
        // Tag 2, then the burst (u32 LE) after the window: 10 a second, bursts of 30.
        let bucket = Limit {
            requests_per_unit: 10,
            window_ms: 1000,
            algorithm: Algorithm::TokenBucket { burst: 30 },
        };
        assert_eq!(rule_id("edge.ip", false, &[bucket]), 0xddc2_7543_a79a_4674);
        // Tag 3: 4 in flight, a lease of 10 minutes.
        let concurrency = Limit {
            requests_per_unit: 4,
            window_ms: 600_000,
            algorithm: Algorithm::Concurrency,
        };
        assert_eq!(
            rule_id("edge.ip", false, &[concurrency]),
            0x6782_4b65_8999_76d4
        );
        assert_eq!(
            rule_id(
                "edge.ip",
                false,
                &[
                    bucket,
                    Limit {
                        requests_per_unit: 100,
                        ..MINUTE
                    }
                ]
            ),
            0x15cb_6c34_c55a_880b
        );
    }

    #[test]
    fn entity_keys_are_pinned_and_length_prefixed() {
        let key = |values: &[&str]| {
            let mut k = EntityKey::new();
            for v in values {
                k.value(v);
            }
            k.finish(7)
        };
        assert_eq!(key(&["1.2.3.4"]), 0xa40c_305f_8fa5_43e0_2593_cb7a_724b_ddd8);
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
    }
}
