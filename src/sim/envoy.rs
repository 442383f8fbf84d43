//! The simulated Envoy of the quota scenarios (`sim/rlqs.rs`): one bucket of Envoy 1.40's
//! `rate_limit_quota` filter, enforcing what sluice assigns exactly as that filter does, on a
//! clock given in milliseconds. A model on purpose: it is the data plane sluice talks to, so it
//! follows Envoy's code, not sluice's.
//!
//! What Envoy 1.40 does, and so what this does:
//! - A bucket's first request is admitted (`no_assignment_behavior`'s default, allow-all) and
//!   sends a report of that bucket at once, with `time_elapsed` zero; until an assignment
//!   arrives, every request is admitted.
//! - A token bucket refills continuously at `tokens_per_fill / fill_interval` (whole seconds:
//!   Envoy drops the nanos, and an interval of 0 is an unlimited rate), holds at most
//!   `max_tokens`, starts full, and a request takes one token or is denied. The same settings
//!   sent again keep the running bucket; other settings replace it, starting at
//!   `floor(new max × floor(old remaining) / old max)` tokens.
//! - A blanket rule allows or denies every request.
//! - An assignment past its TTL (whole seconds) falls back to allow-all, the filter's default
//!   expired-assignment behaviour; a token bucket assigned after that starts full.
//! - An abandon action drops the bucket: its next request is a first request again.
//! - Reports carry `time_elapsed` in whole seconds, rounded down (`rlqs.rs` writes them).

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{
    BlanketRule, Strategy as PbStrategy,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;

use crate::rlqs::carried_tokens;

/// The requests one bucket allowed and denied since its last report, and the time since then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Requests admitted.
    pub allowed: u64,
    /// Requests denied.
    pub denied: u64,
    /// Milliseconds since the bucket's last report (0 on its first).
    pub elapsed_ms: u64,
}

/// What the filter does with the bucket's requests now.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// No assignment yet, or the last one expired: allow-all.
    Fallback,
    Allow,
    Deny,
    Tokens(Tokens),
}

/// A running token bucket (Envoy's `AtomicTokenBucketImpl`): fractional tokens, refilled
/// continuously.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tokens {
    max: u32,
    per_fill: u32,
    fill_s: u64,
    level: f64,
    at_ms: u64,
}

impl Tokens {
    fn full(max: u32, per_fill: u32, fill_s: u64, now_ms: u64) -> Tokens {
        Tokens {
            max,
            per_fill,
            fill_s,
            level: f64::from(max),
            at_ms: now_ms,
        }
    }

    fn same_settings(&self, other: &Tokens) -> bool {
        (self.max, self.per_fill, self.fill_s) == (other.max, other.per_fill, other.fill_s)
    }

    /// Tokens a second; an interval of 0 (under a second, as Envoy reads it) is unlimited.
    fn rate(&self) -> f64 {
        if self.fill_s == 0 {
            f64::INFINITY
        } else {
            f64::from(self.per_fill) / self.fill_s as f64
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed_s = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        self.at_ms = self.at_ms.max(now_ms);
        self.level = (self.level + elapsed_s * self.rate()).min(f64::from(self.max));
    }

    fn take(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        if self.level >= 1.0 {
            self.level -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One bucket of one Envoy's filter.
#[derive(Debug, Clone, PartialEq)]
struct Bucket {
    rule: Rule,
    /// When the assignment in force lapses (ms); `None` under the fallback.
    expires_ms: Option<u64>,
    allowed: u64,
    denied: u64,
    last_report_ms: u64,
}

/// One Envoy's `rate_limit_quota` filter with its one bucket (the scenarios' bucket id).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    bucket: Option<Bucket>,
}

// === impl Filter ===

impl Filter {
    /// A request at `now_ms`: whether it is admitted, and the report to send at once when it
    /// is the bucket's first.
    pub fn request(&mut self, now_ms: u64) -> (bool, Option<Usage>) {
        let Some(b) = self.bucket.as_mut() else {
            // A new bucket: admitted under no assignment, reported at once with a zero
            // elapsed time (its counts start again from there).
            self.bucket = Some(Bucket {
                rule: Rule::Fallback,
                expires_ms: None,
                allowed: 0,
                denied: 0,
                last_report_ms: now_ms,
            });
            let first = Usage {
                allowed: 1,
                denied: 0,
                elapsed_ms: 0,
            };
            return (true, Some(first));
        };
        if b.expires_ms.is_some_and(|at| now_ms >= at) {
            b.rule = Rule::Fallback;
            b.expires_ms = None;
        }
        let admitted = match &mut b.rule {
            Rule::Fallback | Rule::Allow => true,
            Rule::Deny => false,
            Rule::Tokens(t) => t.take(now_ms),
        };
        if admitted {
            b.allowed += 1;
        } else {
            b.denied += 1;
        }
        (admitted, None)
    }

    /// The periodic report at `now_ms` (every bucket, every interval, zeros included); `None`
    /// without a bucket.
    pub fn report(&mut self, now_ms: u64) -> Option<Usage> {
        let b = self.bucket.as_mut()?;
        let usage = Usage {
            allowed: std::mem::take(&mut b.allowed),
            denied: std::mem::take(&mut b.denied),
            elapsed_ms: now_ms.saturating_sub(b.last_report_ms),
        };
        b.last_report_ms = now_ms;
        Some(usage)
    }

    /// Takes sluice's actions for the bucket, received at `now_ms`. An action for a bucket
    /// the filter does not have (abandoned meanwhile) is dropped, as Envoy drops it.
    pub fn apply(&mut self, actions: &[BucketAction], now_ms: u64) {
        for action in actions {
            let Some(b) = self.bucket.as_mut() else {
                return;
            };
            match &action.bucket_action {
                Some(Action::AbandonAction(_)) => self.bucket = None,
                Some(Action::QuotaAssignmentAction(q)) => {
                    let ttl_s = q
                        .assignment_time_to_live
                        .as_ref()
                        .map_or(0, |d| u64::try_from(d.seconds).unwrap_or(0));
                    let strategy = q.rate_limit_strategy.as_ref().and_then(|s| s.strategy);
                    b.rule = next_rule(&b.rule, strategy.as_ref(), now_ms);
                    // A TTL under a second is none: the assignment lapses at once.
                    b.expires_ms = Some(now_ms + ttl_s * 1000);
                }
                None => {}
            }
        }
    }

    /// The assignment in force at `now_ms` as (rate a second, tokens now): `None` for no
    /// token bucket (allow-all, deny-all or no bucket).
    pub fn tokens(&self, now_ms: u64) -> Option<(f64, f64)> {
        let b = self.bucket.as_ref()?;
        if b.expires_ms.is_some_and(|at| now_ms >= at) {
            return None;
        }
        match b.rule {
            Rule::Tokens(mut t) => {
                t.refill(now_ms);
                Some((t.rate(), t.level))
            }
            _ => None,
        }
    }
}

/// What the filter enforces after an assignment of `strategy` replaced `old` at `now_ms`. A
/// strategy Envoy does not enforce (`requests_per_time_unit`, none) fails open.
fn next_rule(old: &Rule, strategy: Option<&PbStrategy>, now_ms: u64) -> Rule {
    match strategy {
        Some(PbStrategy::BlanketRule(r)) if *r == BlanketRule::DenyAll as i32 => Rule::Deny,
        Some(PbStrategy::TokenBucket(tb)) => {
            let per_fill = tb.tokens_per_fill.as_ref().map_or(1, |v| v.value);
            let fill_s = tb
                .fill_interval
                .as_ref()
                .map_or(0, |d| u64::try_from(d.seconds).unwrap_or(0));
            let mut new = Tokens::full(tb.max_tokens, per_fill, fill_s, now_ms);
            if let Rule::Tokens(running) = old {
                let mut running = *running;
                if running.same_settings(&new) {
                    return Rule::Tokens(running);
                }
                running.refill(now_ms);
                // Envoy carries the share of tokens left: whole tokens, rounded down.
                let remaining = running.level.max(0.0).floor() as u32;
                new.level = f64::from(carried_tokens(running.max, remaining, new.max));
            }
            Rule::Tokens(new)
        }
        _ => Rule::Allow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rlqs::{strategy_proto, Assignment, Strategy};
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
        AbandonAction, QuotaAssignmentAction,
    };

    fn assign(strategy: Strategy, ttl_s: u32) -> BucketAction {
        let a = Assignment { strategy, ttl_s };
        BucketAction {
            bucket_id: None,
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(a.ttl_proto()),
                rate_limit_strategy: Some(strategy_proto(&a.strategy)),
            })),
        }
    }

    fn tb(max_tokens: u32, tokens_per_fill: u32, fill_interval_s: u32) -> Strategy {
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        }
    }

    fn admitted(f: &mut Filter, at_ms: u64, n: usize) -> usize {
        (0..n).filter(|_| f.request(at_ms).0).count()
    }

    #[test]
    fn a_first_request_is_admitted_and_reported_at_once() {
        let mut f = Filter::default();
        let (ok, first) = f.request(100);
        assert!(ok);
        assert_eq!(
            first,
            Some(Usage {
                allowed: 1,
                denied: 0,
                elapsed_ms: 0
            })
        );
        // No assignment yet: everything is admitted, and reported from the first report on.
        assert_eq!(admitted(&mut f, 150, 50), 50);
        let r = f.report(5_100).unwrap();
        assert_eq!((r.allowed, r.denied, r.elapsed_ms), (50, 0, 5_000));
        assert_eq!(f.report(10_100).unwrap().allowed, 0);
    }

    #[test]
    fn a_token_bucket_starts_full_and_refills_continuously() {
        let mut f = Filter::default();
        f.request(0);
        f.apply(&[assign(tb(10, 5, 1), 15)], 0);
        assert_eq!(admitted(&mut f, 0, 20), 10);
        // Five a second: one every 200 ms.
        assert_eq!(admitted(&mut f, 400, 5), 2);
        assert_eq!(f.report(1_000).unwrap().denied, 13);
    }

    #[test]
    fn the_same_settings_keep_the_bucket_and_others_carry_its_share() {
        let mut f = Filter::default();
        f.request(0);
        f.apply(&[assign(tb(10, 1, 1), 15)], 0);
        assert_eq!(admitted(&mut f, 0, 6), 6);
        // Resent as is: the running bucket (4 left) goes on.
        f.apply(&[assign(tb(10, 1, 1), 15)], 0);
        assert_eq!(admitted(&mut f, 0, 10), 4);
        f.apply(&[assign(tb(10, 1, 1), 15)], 0);
        assert_eq!(f.tokens(0), Some((1.0, 0.0)));
        // 4 of 10 left, replaced by a bucket of 25: floor(25 × 4 / 10) = 10.
        let mut g = Filter::default();
        g.request(0);
        g.apply(&[assign(tb(10, 1, 1), 15)], 0);
        admitted(&mut g, 0, 6);
        g.apply(&[assign(tb(25, 2, 1), 15)], 0);
        assert_eq!(admitted(&mut g, 0, 30), 10);
    }

    #[test]
    fn blanket_rules_expiry_and_abandon() {
        let mut f = Filter::default();
        f.request(0);
        f.apply(&[assign(Strategy::DenyAll, 2)], 0);
        assert_eq!(admitted(&mut f, 1_999, 3), 0);
        // Lapsed: allow-all, and a token bucket after that starts full.
        assert_eq!(admitted(&mut f, 2_000, 3), 3);
        f.apply(&[assign(tb(2, 1, 60), 15)], 2_000);
        assert_eq!(admitted(&mut f, 2_000, 3), 2);
        let abandon = BucketAction {
            bucket_id: None,
            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
        };
        f.apply(&[abandon], 3_000);
        assert_eq!(f.report(4_000), None);
        let (ok, first) = f.request(4_000);
        assert!(ok && first.is_some_and(|u| u.elapsed_ms == 0));
    }
}
