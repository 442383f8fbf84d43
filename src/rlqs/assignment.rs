//! What a stream is sent for one bucket ([`Assignment`]): the strategy Envoy enforces and its
//! time to live, and their encoding in the protocol's messages. `share.rs` decides them.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as PbStrategy,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

/// What Envoy does with a bucket's requests: the strategies Envoy 1.40 honours (it fails open
/// on `requests_per_time_unit`, so that is never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A token bucket; every field is at least 1.
    TokenBucket {
        /// The bucket's capacity.
        max_tokens: u32,
        /// Tokens added every fill interval.
        tokens_per_fill: u32,
        /// Whole seconds between fills.
        fill_interval_s: u32,
    },
    /// Every request denied.
    DenyAll,
    /// Every request allowed.
    AllowAll,
}

/// One bucket's assignment: a strategy and its time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// What Envoy does with the bucket's requests.
    pub strategy: Strategy,
    /// Whole seconds until Envoy drops the assignment (at least 1).
    pub ttl_s: u32,
}

// === impl Assignment ===

impl Assignment {
    /// This assignment as the proto's `assignment_time_to_live`.
    pub fn ttl_proto(&self) -> PbDuration {
        PbDuration {
            seconds: i64::from(self.ttl_s.max(1)),
            nanos: 0,
        }
    }
}

/// A strategy as the proto's `RateLimitStrategy`.
pub fn strategy_proto(strategy: &Strategy) -> RateLimitStrategy {
    let strategy = match *strategy {
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        } => PbStrategy::TokenBucket(TokenBucket {
            max_tokens: max_tokens.max(1),
            tokens_per_fill: Some(UInt32Value {
                value: tokens_per_fill.max(1),
            }),
            fill_interval: Some(PbDuration {
                seconds: i64::from(fill_interval_s.max(1)),
                nanos: 0,
            }),
        }),
        Strategy::DenyAll => PbStrategy::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::AllowAll => PbStrategy::BlanketRule(BlanketRule::AllowAll as i32),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

/// Whole seconds of `d`, rounded up, between 1 and `u32::MAX`: Envoy 1.40 drops a TTL under
/// a second at once.
pub fn whole_secs(d: Duration) -> u32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX).max(1)
}
