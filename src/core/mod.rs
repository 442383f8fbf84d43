//! The pure core: time, the limit vocabulary, window counters, token buckets, the fleet view,
//! pressure tiers and the entity table. Nothing here does I/O or reads the clock: `now` is
//! always an argument, so every decision can be replayed on a manual clock. See
//! ARCHITECTURE.md, "The path of a request".
//!
//! The modules import one way: `clock`, `limit`, `fleet_view` and `gcra` (the token-bucket
//! arithmetic) are leaves; `window` and `bucket` use them; `state` holds either; `tier`,
//! `table` and `decide` work on `state`.

pub mod bucket;
pub mod clock;
pub mod decide;
pub mod fleet_view;
pub mod gcra;
pub mod limit;
pub mod state;
pub mod table;
pub mod tier;
pub mod window;

pub use clock::{Clock, ManualClock, SystemClock, UnixMillis};
pub use decide::{decide, Count, Decision, Outcome, Wants};
pub use fleet_view::FleetView;
pub use limit::{Algorithm, Limit, Verdict, MAX_COUNT};
pub use state::{LimitState, Plan, Summary};
pub use tier::{SyncPolicy, Tier};
pub use window::{Held, Part, SyncPlan, WindowState};

#[cfg(test)]
pub(crate) mod fixtures;
