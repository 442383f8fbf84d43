//! The pure core: time, window counters, token buckets, the fleet estimate, pressure tiers and the entity
//! table. Nothing here does I/O or reads the clock: `now` is always an argument, so every
//! decision can be replayed on a manual clock. See ARCHITECTURE.md, "The path of a request".

pub mod bucket;
pub mod clock;
pub mod fleet;
pub mod gcra;
pub mod prior;
pub mod state;
pub mod table;
pub mod tier;
pub mod window;

pub use clock::{Clock, ManualClock, SystemClock, UnixMillis};
pub use fleet::SyncPlan;
pub use prior::FleetView;
pub use state::{LimitState, Plan, Summary};
pub use tier::{SyncPolicy, Tier};
pub use window::{
    decide, decide_lenient, Algorithm, Counter, Limit, Verdict, WindowState, MAX_COUNT,
};

#[cfg(test)]
mod fixtures;
