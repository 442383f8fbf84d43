//! The sketch of evicted entities ([`Sketch`]): a conservative summary of what the
//! entities a shard evicted still counted, so a returning value starts from an
//! over-estimate, never from nothing.

use super::secs;
use crate::core::clock::UnixMillis;
use crate::core::limit::{Algorithm, Limit};
use crate::core::state::Summary;

/// A conservative summary of evicted entities: four rows of cells, each holding the largest
/// value folded into it. A point query takes the smallest of its four cells, which is never
/// below what was folded for that point (every one of its cells holds at least that), and
/// for a point never folded is the largest of a few colliding others: small unless all four
/// of its cells met heavy ones. Window counts carry when they stop mattering, so dead cells
/// are reused; a bucket's value is when it is full again, dead by itself once past.
#[derive(Debug)]
pub(super) struct Sketch {
    width: usize,
    windows: Box<[WindowCell]>,
    buckets: Box<[u64]>,
}

#[derive(Debug, Clone, Copy, Default)]
struct WindowCell {
    /// When the count stops mattering (Unix seconds).
    until_s: u32,
    count: u32,
}

const ROWS: usize = 4;

/// A 64-bit mix (splitmix64's finaliser): the cells of a point in each row.
pub(super) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Sketch {
    pub(super) fn new(width: usize) -> Self {
        Sketch {
            width,
            windows: vec![WindowCell::default(); ROWS * width].into_boxed_slice(),
            buckets: vec![0; ROWS * width].into_boxed_slice(),
        }
    }

    fn cells(&self, key: u128, limit: usize, epoch: u64) -> [usize; ROWS] {
        let h = mix(key as u64 ^ mix((key >> 64) as u64 ^ mix(epoch ^ ((limit as u64) << 56))));
        // A mix of its own per row: with rows derived from one another (double hashing), two
        // points that meet in one row meet in all of them far more often, and a heavy point
        // then reads as the other's estimate.
        std::array::from_fn(|r| {
            let row = mix(h ^ (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            r * self.width + (row % self.width as u64) as usize
        })
    }

    pub(super) fn fold(
        &mut self,
        key: u128,
        limit: usize,
        l: &Limit,
        summary: Summary,
        now_s: u32,
    ) {
        match summary {
            Summary::Window { epoch, counts } => {
                for (e, count) in [(epoch.wrapping_sub(1), counts[0]), (epoch, counts[1])] {
                    // A count matters until the end of the epoch after its own (the sliding
                    // window reads the previous epoch).
                    let until = (e.saturating_add(2).saturating_mul(l.window_ms)).div_ceil(1000);
                    let until_s = until.min(u64::from(u32::MAX)) as u32;
                    let count = count.min(u64::from(u32::MAX)) as u32;
                    if count == 0 || until_s < now_s {
                        continue;
                    }
                    for c in self.cells(key, limit, e) {
                        let cell = &mut self.windows[c];
                        if cell.until_s < now_s {
                            *cell = WindowCell { until_s, count };
                        } else {
                            cell.until_s = cell.until_s.max(until_s);
                            cell.count = cell.count.max(count);
                        }
                    }
                }
            }
            Summary::Bucket { full_at_ms } => {
                for c in self.cells(key, limit, u64::MAX) {
                    self.buckets[c] = self.buckets[c].max(full_at_ms);
                }
            }
        }
    }

    pub(super) fn query(
        &self,
        key: u128,
        limit: usize,
        l: &Limit,
        now: UnixMillis,
    ) -> Option<Summary> {
        let now_s = secs(now);
        match l.algorithm {
            Algorithm::TokenBucket { .. } => {
                let full_at_ms = self
                    .cells(key, limit, u64::MAX)
                    .iter()
                    .map(|&c| self.buckets[c])
                    .min()
                    .unwrap_or(0);
                (full_at_ms > now.0).then_some(Summary::Bucket { full_at_ms })
            }
            _ => {
                let epoch = now.0 / l.window_ms;
                let count = |e: u64| {
                    self.cells(key, limit, e)
                        .iter()
                        .map(|&c| {
                            let cell = self.windows[c];
                            if cell.until_s >= now_s {
                                u64::from(cell.count)
                            } else {
                                0
                            }
                        })
                        .min()
                        .unwrap_or(0)
                };
                let counts = [count(epoch.wrapping_sub(1)), count(epoch)];
                (counts != [0, 0]).then_some(Summary::Window { epoch, counts })
            }
        }
    }
}
