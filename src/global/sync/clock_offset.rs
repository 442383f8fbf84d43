//! Time across replicas: this node's clock offset from the store's `TIME`, measured at start
//! and every 30 s, so that every replica's epochs begin at the same instant.

use std::time::Duration;

use super::store::{ShardStore, StoreError};
use crate::core::clock::Clock;

/// Measures the offset of this node's clock from the store's: the store's time minus the
/// local time at the middle of the round trip. Applied to the clock, it makes epochs agree
/// across nodes whose clocks disagree.
///
/// # Errors
/// The store's error.
pub async fn measure_offset<S: ShardStore>(
    store: &S,
    clock: &dyn Clock,
    timeout: Duration,
) -> Result<i64, StoreError> {
    let before = clock.now().0 as i64 - clock.offset_ms();
    let remote = tokio::time::timeout(timeout, store.time_ms())
        .await
        .map_err(|_| StoreError::Timeout(timeout))??;
    let after = clock.now().0 as i64 - clock.offset_ms();
    Ok(remote as i64 - (before + after) / 2)
}
