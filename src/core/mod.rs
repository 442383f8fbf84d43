//! The pure core: time, the limit vocabulary, window counters, token buckets, the fleet view,
//! pressure tiers and the entity table. Nothing here does I/O or reads the clock: `now` is
//! always an argument, so every decision can be replayed on a manual clock. See
//! ARCHITECTURE.md, "The path of a request".
//!
//! The modules import one way. `clock.rs` and `fleet_view.rs` are the leaves: they import no
//! other part of the core. `limit.rs` (the limit vocabulary) uses the clock, and `gcra.rs`
//! (the token-bucket arithmetic) the limit; `window/` and `bucket/` (on `gcra.rs`) use those;
//! `state.rs` holds either; `tier.rs`, `table/` and `decide.rs` work on `state.rs`; `exact.rs`
//! (the verdict of an `exact: true` limit on the store's counts) on `window/` and `bucket/`.

pub mod bucket;
pub mod clock;
pub mod decide;
pub mod exact;
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
