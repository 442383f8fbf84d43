//! What a replica knows of the fleet when it decides ([`FleetView`]: the live replicas its
//! heartbeats count, the sync tick, the last departure), and the constants about the fleet
//! that windows and buckets share: the prior's slack, the burst reads' window and spread, the
//! shortest rate sample. What is decided from them lives with each counter
//! (`window/prior.rs`, `bucket/`). A leaf: an argument of every decision, never shared state.

/// Replies closer together than this give no rate sample: a handful of hits over a few
/// milliseconds says little about a rate. Burst reads (`window/prior.rs`) are the exception: a
/// young entity's count re-read while its fleet runs into the limit within a tick.
pub(super) const MIN_SAMPLE_MS: u64 = 100;

/// The fewest own hits that make a young entity worth a burst read, and half the smallest
/// prior that does. With fewer, a re-read changes a decision or two at most, and a read
/// taken while other replicas have not re-read yet (their few hits not in it) gives out
/// more than the prior would: 4 replicas on a limit of 40 admitted up to 1.13× (1.10× on
/// the prior alone).
pub const BURST_MIN_OWN: u64 = 8;

/// How long after an entity's first reply burst reads are taken. A burst that reaches the
/// limit later than this (a few hundred hits a second, not a few thousand) is decided on the
/// prior, as before burst reads; the bound also bounds what they cost (`global/sync/shard.rs`).
pub const BURST_WINDOW_MS: u64 = 100;

/// How many standard deviations of a binomial share a node may go above its even share of
/// the room a reply left: `sqrt(room / live)` each, at most [`BURST_SLACK`]'s part. The
/// uneven shares are what the slack is for, and they grow as the square root of the room,
/// not as the room: on a room of a few hits a share the slack bounds; on a limit of 400 per
/// extra replica, the spread, which took the simulator's bursts there from 1.07–1.08× to
/// 1.04–1.05× admitted at 0.2–0.4 % false denials.
pub(super) const BURST_SPREAD: f64 = 2.0;

/// How far above its even share of the limit a young entity's node may go. A burst lands
/// on the replicas in binomial shares, and a node above `limit / N` denies hits the exact
/// limiter admits while another is below it. 5 % more, at the cost of at most 5 % admitted
/// over the limit while the whole fleet is young, took the simulator's within-a-tick bursts
/// (six seeds) from 0.5–3.7 % false denials to 0–1.2 % at 2 replicas, 1.2–5.3 % to 0–4.1 %
/// at 4, 5.2–7.2 % to 3.5–5.4 % at 20 and 7.4–10.7 % to 5.2–8.5 % at 50.
pub const PRIOR_SLACK: f64 = 1.05;

/// What a node knows of the fleet when it decides: an argument, never read from shared
/// state inside the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetView {
    /// Live replicas (this one included), as the last heartbeat reply counted them; ≥ 1.
    pub live: u32,
    /// The sync tick (ms): how long after an entity's first reply its count is trusted.
    pub tick_ms: u64,
    /// The live count just before the last time it dropped (0: it never dropped).
    pub before: u32,
    /// When the count last dropped (Unix ms of the reply that showed it).
    pub dropped_at: u64,
    /// The live count just before the last time it rose (0: it never rose).
    pub before_rise: u32,
    /// When the count last rose (Unix ms of the reply that showed it).
    pub rose_at: u64,
}

impl FleetView {
    /// A node alone (local mode, or a fleet whose size is not known yet): no prior.
    pub const ALONE: FleetView = FleetView {
        live: 1,
        tick_ms: 1000,
        before: 0,
        dropped_at: 0,
        before_rise: 0,
        rose_at: 0,
    };

    /// The hits a node may admit in a window before the fleet's count is known: its even
    /// share of the limit with [`PRIOR_SLACK`], at least 1.
    pub fn prior(&self, rpu: u32) -> u64 {
        let even = f64::from(rpu) * PRIOR_SLACK / f64::from(self.live.max(1));
        (even as u64).max(1)
    }

    /// Whether the live count rose since an entity's first reply at `first_reply` (Unix ms;
    /// 0: none yet), or with it: the last rise was shown by a heartbeat reply no earlier than
    /// that one (a tick's call carries both). That entity's hits so far were decided on the
    /// count before, by replicas among which the newcomer was not serving
    /// (`window/prior.rs`, "Replicas joining while an entity is young").
    #[inline]
    pub fn rose_since(&self, first_reply: u64) -> bool {
        first_reply != 0 && self.before_rise != 0 && first_reply <= self.rose_at
    }

    /// The prior ([`FleetView::prior`]) of an entity whose first reply came at `first_reply`:
    /// on the count before the last rise when it rose since ([`FleetView::rose_since`]) and
    /// is not lower now.
    pub fn prior_since(&self, rpu: u32, first_reply: u64) -> u64 {
        if !self.rose_since(first_reply) {
            return self.prior(rpu);
        }
        let live = self.live.min(self.before_rise);
        FleetView { live, ..*self }.prior(rpu)
    }

    /// The share of the room a node takes when it has no measured share: `1 / live`.
    #[inline]
    pub fn prior_share(&self) -> f64 {
        1.0 / f64::from(self.live.max(1))
    }

    /// How much of the others' rate measured at `measured_at` (Unix ms) still applies: less
    /// than 1 when replicas left since.
    #[inline]
    pub fn rate_factor(&self, measured_at: u64) -> f64 {
        if self.before > self.live && self.before >= 2 && measured_at < self.dropped_at {
            f64::from(self.live.max(1) - 1) / f64::from(self.before - 1)
        } else {
            1.0
        }
    }
}
