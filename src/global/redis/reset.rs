//! An operator's reset of an entity's counters on Redis (`global/exact/reset.rs` says why it
//! works this way): one call of `reset.lua` per entity, whose keys share a cluster slot (the
//! hash tag), so a Redis Cluster runs it as a standalone server does.

use deadpool_redis::redis::Value;

use super::error::backend;
use super::keys::{bucket_key_of, exact_bucket_key, exact_key, window_key};
use super::pool::RedisPool;
use super::script::{Call, Lua};
use crate::global::exact::{ResetItem, ResetKind, ResetReply};
use crate::global::sync::store::StoreError;

/// KEYS: the entity's counters; ARGV: what each is (`w`, `b`, `x`, `xb`). Returns each key's
/// count before.
pub(crate) const RESET_SCRIPT: &str = include_str!("reset.lua");

/// The keys of `it` and their kinds, as the script takes them: two per window (current,
/// previous epoch), one per bucket.
fn keys(prefix: &str, it: &ResetItem) -> Vec<(String, &'static str)> {
    let (e, l) = (it.entity, it.limit);
    match it.kind {
        ResetKind::Window { epochs } => epochs
            .iter()
            .map(|&ep| (window_key(prefix, e, l, ep), "w"))
            .collect(),
        ResetKind::Bucket => vec![(bucket_key_of(prefix, e, l), "b")],
        ResetKind::ExactWindow { epochs } => epochs
            .iter()
            .map(|&ep| (exact_key(prefix, e, l, ep), "x"))
            .collect(),
        ResetKind::ExactBucket => vec![(exact_bucket_key(prefix, e, l), "xb")],
    }
}

/// Resets `items` on `pool`: a script call per entity (in the order they first come).
///
/// # Errors
/// A call failed; the entities before it were reset.
pub(crate) async fn reset(
    pool: &RedisPool,
    lua: &Lua,
    prefix: &str,
    items: &[ResetItem],
) -> Result<ResetReply, StoreError> {
    let mut entities: Vec<u128> = items.iter().map(|it| it.entity).collect();
    entities.sort_unstable();
    entities.dedup();
    let mut out = vec![[0; 2]; items.len()];
    let mut conn = pool.get().await.map_err(backend)?;
    for entity in entities {
        let of: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].entity == entity)
            .collect();
        let ks: Vec<Vec<(String, &str)>> = of.iter().map(|&i| keys(prefix, &items[i])).collect();
        let call = Call::new(lua, |cmd| {
            let all: Vec<&(String, &str)> = ks.iter().flatten().collect();
            cmd.arg(all.len());
            for (k, _) in &all {
                cmd.arg(k);
            }
            for (_, kind) in &all {
                cmd.arg(*kind);
            }
        });
        let v = call.run(&mut conn).await.map_err(backend)?;
        let Value::Array(vals) = v else {
            return Err(StoreError::reply(format!("unexpected reset reply {v:?}")));
        };
        let mut vals = vals.iter().map(|v| match v {
            Value::Int(i) => (*i).max(0) as u64,
            _ => 0,
        });
        for (&i, k) in of.iter().zip(&ks) {
            let mut c = [0; 2];
            for slot in c.iter_mut().take(k.len()) {
                *slot = vals.next().unwrap_or(0);
            }
            out[i] = c;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_names_the_keys_the_sync_and_the_exact_rules_use() {
        let it = |kind| ResetItem {
            entity: 0xab,
            limit: 1,
            kind,
            per_second: false,
        };
        let e = "{000000000000000000000000000000ab}";
        assert_eq!(
            keys("p:", &it(ResetKind::Window { epochs: [10, 9] })),
            vec![
                (format!("p:sluice:v2:{e}:1:10"), "w"),
                (format!("p:sluice:v2:{e}:1:9"), "w")
            ]
        );
        assert_eq!(
            keys("p:", &it(ResetKind::Bucket)),
            vec![(format!("p:sluice:b1:{e}:1"), "b")]
        );
        assert_eq!(
            keys("p:", &it(ResetKind::ExactWindow { epochs: [10, 9] })),
            vec![
                (format!("p:sluice:x:{e}:1:10"), "x"),
                (format!("p:sluice:x:{e}:1:9"), "x")
            ]
        );
        assert_eq!(
            keys("p:", &it(ResetKind::ExactBucket)),
            vec![(format!("p:sluice:xb:{e}:1"), "xb")]
        );
    }
}
