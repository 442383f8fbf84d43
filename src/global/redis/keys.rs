//! The names of the keys sluice keeps in Redis, and a replica's field in them: the sync's
//! counters and buckets (`sync.rs`), the exact rules' (`exact.rs`), the RLQS streams'
//! fields (`presence.rs`); `reset.rs` names the same keys. Apart from each, so they share the
//! names without naming each other. An entity's keys all hash to one Cluster slot (its
//! `{entity}` tag).
//!
//! The names are written byte by byte rather than with `format!`: the sync names two keys
//! per synced entity on every tick, and `format!`'s machinery (a 128-bit hex, padding, two
//! decimals) cost some 600 instructions a key on the request-rate path (`benches/cpu.sh`,
//! `MODE=instructions`). The tests hold each name to its `format!` spelling.

/// The key of the counter of (`entity`, `limit`, `epoch`).
pub(crate) fn window_key(prefix: &str, entity: u128, limit: u8, epoch: u64) -> String {
    let mut k = tagged(prefix, "sluice:v2:{", entity, limit);
    k.push(':');
    push_decimal(&mut k, epoch);
    k
}

/// The key of the bucket of (`entity`, `limit`).
pub(crate) fn bucket_key_of(prefix: &str, entity: u128, limit: u8) -> String {
    tagged(prefix, "sluice:b1:{", entity, limit)
}

/// A replica's field in every counter.
pub(crate) fn field(replica: u64) -> String {
    format!("{replica:016x}")
}

/// The Redis key of an exact counter.
pub fn exact_key(prefix: &str, entity: u128, limit: u8, epoch: u64) -> String {
    let mut k = tagged(prefix, "sluice:x:{", entity, limit);
    k.push(':');
    push_decimal(&mut k, epoch);
    k
}

/// The Redis key of an exact token bucket: its `tat` (see `exact.rs`'s `EXACT_SCRIPT`). No epoch: a
/// bucket is one value for good, gone when full.
pub fn exact_bucket_key(prefix: &str, entity: u128, limit: u8) -> String {
    tagged(prefix, "sluice:xb:{", entity, limit)
}

/// `{prefix}{kind}{entity:032x}}:{limit}`, with room for an epoch after it.
fn tagged(prefix: &str, kind: &str, entity: u128, limit: u8) -> String {
    let mut k = String::with_capacity(prefix.len() + kind.len() + 32 + 2 + 3 + 1 + 20);
    k.push_str(prefix);
    k.push_str(kind);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..32).rev() {
        k.push(char::from(HEX[(entity >> (shift * 4)) as usize & 0xf]));
    }
    k.push_str("}:");
    push_decimal(&mut k, u64::from(limit));
    k
}

/// `n` in decimal, as `{n}` writes it.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTITIES: [u128; 4] = [0, 1, 0xfedc_ba98_7654_3210_0f1e_2d3c_4b5a_6978, u128::MAX];
    const EPOCHS: [u64; 5] = [0, 7, 10, 1_764_000_000, u64::MAX];

    /// Each name is the one `format!` wrote before: a replica reads the keys another version
    /// wrote, and `reset.rs` and the Lua scripts name the same ones.
    #[test]
    fn names_are_their_format_spelling() {
        for prefix in ["", "app:"] {
            for entity in ENTITIES {
                for limit in [0u8, 9, 10, 255] {
                    assert_eq!(
                        bucket_key_of(prefix, entity, limit),
                        format!("{prefix}sluice:b1:{{{entity:032x}}}:{limit}")
                    );
                    assert_eq!(
                        exact_bucket_key(prefix, entity, limit),
                        format!("{prefix}sluice:xb:{{{entity:032x}}}:{limit}")
                    );
                    for epoch in EPOCHS {
                        assert_eq!(
                            window_key(prefix, entity, limit, epoch),
                            format!("{prefix}sluice:v2:{{{entity:032x}}}:{limit}:{epoch}")
                        );
                        assert_eq!(
                            exact_key(prefix, entity, limit, epoch),
                            format!("{prefix}sluice:x:{{{entity:032x}}}:{limit}:{epoch}")
                        );
                    }
                }
            }
        }
    }
}
