//! The decision log: one structured line per descriptor decided (domain, rule or "no rule",
//! count and limit, code), every one at debug, or a sample at info at a bounded rate
//! (`DECISION_LOG_RATE` lines a second) that is safe to leave on in production.
//!
//! Descriptor values are often secrets or personal data (API keys, client addresses), so a
//! line names the descriptor's keys, and its values only with `DECISION_LOG_VALUES=true`.

use std::fmt::{self, Display};
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use crate::core::clock::UnixMillis;
use crate::core::Outcome;
use crate::rules::Rule;

/// The log target of decision lines: `LOG_LEVEL=sluice::decision=debug` logs them alone.
pub const TARGET: &str = "sluice::decision";

/// Where decisions are logged, and the sampler's state.
#[derive(Debug)]
pub struct DecisionLog {
    /// Sampled lines a second at info; 0: none.
    rate: u32,
    /// Whether lines carry the descriptors' values.
    values: bool,
    /// The sampler's theoretical arrival time, in µs (a GCRA: `rate` lines a second, a
    /// second's worth at once).
    tat_us: AtomicU64,
    /// Lines the sampler left out since the last it wrote.
    skipped: AtomicU64,
}

/// What one line says of a descriptor.
pub struct Decision<'a> {
    pub domain: &'a str,
    pub entries: &'a [Entry],
    pub rule: Option<&'a Rule>,
    pub outcome: Option<&'a Outcome>,
}

impl DecisionLog {
    /// A log writing up to `rate` sampled lines a second (0: none), with the descriptors'
    /// values when `values`.
    pub fn new(rate: u32, values: bool) -> Self {
        DecisionLog {
            rate,
            values,
            tat_us: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// Whether a decision may be logged at all: checked before building a line, so the
    /// request path pays one branch when the log is off.
    pub fn wanted(&self) -> bool {
        self.rate > 0 || tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
    }

    /// Logs `d`: at debug when that is on, else at info when the sampler lets it through.
    pub fn log(&self, now: UnixMillis, d: &Decision<'_>) {
        let line = Line {
            d,
            values: self.values,
        };
        let (code, count, limit) = (line.code(), line.count(), line.limit());
        let rule = d.rule.map_or("no rule", |r| r.full_key.as_str());
        if tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
            tracing::debug!(target: TARGET, domain = d.domain, rule, code, count, limit, descriptor = %line, "decision");
        } else if self.admit(now) {
            let skipped = self.skipped.swap(0, Ordering::Relaxed);
            tracing::info!(target: TARGET, domain = d.domain, rule, code, count, limit, descriptor = %line, skipped, "decision (sampled)");
        } else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the sampler lets a line through at `now`: `rate` a second, a second's worth
    /// at once after a quiet spell.
    fn admit(&self, now: UnixMillis) -> bool {
        if self.rate == 0 {
            return false;
        }
        let interval = 1_000_000 / u64::from(self.rate);
        let now_us = now.0.saturating_mul(1000);
        let tolerance = 1_000_000u64.saturating_sub(interval);
        self.tat_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                (tat <= now_us + tolerance).then(|| tat.max(now_us) + interval)
            })
            .is_ok()
    }
}

/// A decision's descriptor as a line shows it: `key=value,...` with values, else its keys.
struct Line<'a> {
    d: &'a Decision<'a>,
    values: bool,
}

impl Line<'_> {
    /// The descriptor's code: `OK`, `OVER_LIMIT`, `SHADOW` (over, reported OK in shadow
    /// mode), `UNLIMITED`, or `NO_RULE`.
    fn code(&self) -> &'static str {
        match (self.d.rule, self.d.outcome) {
            (None, _) => "NO_RULE",
            (Some(_), None) => "UNLIMITED",
            (Some(r), Some(o)) if o.over && r.shadow_mode => "SHADOW",
            (Some(_), Some(o)) if o.over => "OVER_LIMIT",
            _ => "OK",
        }
    }

    /// The reported limit's count with this request's hits; 0 when nothing was counted.
    fn count(&self) -> u64 {
        self.d.outcome.map_or(0, |o| o.verdict.count_after)
    }

    /// The reported limit's `requests_per_unit`; 0 without one.
    fn limit(&self) -> u32 {
        match (self.d.rule, self.d.outcome) {
            (Some(r), Some(o)) => r
                .limits
                .get(o.reported)
                .map_or(0, |s| s.limit.requests_per_unit),
            _ => 0,
        }
    }
}

impl Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.d.entries.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            if self.values {
                write!(f, "{sep}{}={}", e.key, e.value)?;
            } else {
                write!(f, "{sep}{}", e.key)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sampler_lets_through_its_rate_and_a_seconds_worth_at_once() {
        let log = DecisionLog::new(4, false);
        let t = |ms: u64| UnixMillis(1_700_000_000_000 + ms);
        // A quiet start: a second's worth at once, then nothing more in that instant.
        let first: usize = (0..10).filter(|_| log.admit(t(0))).count();
        assert_eq!(first, 4);
        // Then one every quarter of a second.
        assert!(!log.admit(t(200)));
        assert!(log.admit(t(250)));
        assert!(!log.admit(t(300)));
        // Over ten busy seconds, four a second: forty, and the bit of a second's worth
        // that built up since.
        let later: usize = (0..1000).filter(|i| log.admit(t(300 + i * 10))).count();
        assert!((40..=43).contains(&later), "{later} over ten seconds");
        // Off: nothing.
        assert!(!DecisionLog::new(0, false).admit(t(0)));
    }

    #[test]
    fn a_line_names_keys_and_values_only_when_allowed() {
        let entries = [
            Entry {
                key: "api_key".into(),
                value: "secret".into(),
            },
            Entry {
                key: "path".into(),
                value: "/login".into(),
            },
        ];
        let d = Decision {
            domain: "edge",
            entries: &entries,
            rule: None,
            outcome: None,
        };
        assert_eq!(
            Line {
                d: &d,
                values: false
            }
            .to_string(),
            "api_key,path"
        );
        assert_eq!(
            Line {
                d: &d,
                values: true
            }
            .to_string(),
            "api_key=secret,path=/login"
        );
        assert_eq!(
            Line {
                d: &d,
                values: true
            }
            .code(),
            "NO_RULE"
        );
    }
}
