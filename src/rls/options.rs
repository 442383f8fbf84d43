//! The service's behaviour switches and request bounds ([`Options`], built by `settings/`
//! from the reference's variables), with the names and format of the rate-limit headers.

use crate::core::table::CacheSettings;
use crate::telemetry::SeriesBounds;

/// Names of the rate-limit response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit of the most restrictive descriptor.
    pub limit: String,
    /// Hits left under it.
    pub remaining: String,
    /// Seconds until its window resets.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Which rate-limit response headers `LIMIT_RESPONSE_HEADERS_ENABLED` adds
/// (`LIMIT_RESPONSE_HEADERS_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderFormat {
    /// The reference's `RateLimit-Limit`, `-Remaining` and `-Reset` ([`HeaderNames`]).
    #[default]
    Reference,
    /// draft-ietf-httpapi-ratelimit-headers-11's `RateLimit-Policy` and `RateLimit`
    /// (docs/wire.md, "IETF headers and the problem body").
    Ietf,
}

/// `EXACT_BELOW`'s default: a limit of fewer than 16 hits a window is shared exactly.
///
/// Why 16: shared by estimates, each replica decides on its share of the room until the
/// fleet's counts meet, and a share of a few hits rounds to whole hits on every replica (a
/// limit of 3 a day on two replicas admitted 2 to 4). 16 is four hits a replica on four
/// replicas; the simulator's burst scenarios show estimates holding from about ten a replica
/// (40 on four processes). A static threshold, not one that follows the live replicas: every
/// replica then takes the same path for a rule whatever it knows of the fleet, as the two
/// paths keep two separate counts.
pub const EXACT_BELOW: u32 = 16;

/// Behaviour switches and request bounds of the service.
#[derive(Debug, Clone)]
pub struct Options {
    /// `SHADOW_MODE`: the overall code is always OK.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every rule is treated as a quota.
    pub quota_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: add rate-limit headers (with these names).
    pub response_headers: Option<HeaderNames>,
    /// `LIMIT_RESPONSE_HEADERS_FORMAT`: which headers `response_headers` adds.
    pub header_format: HeaderFormat,
    /// `LIMIT_RESPONSE_BODY=problem`: a refused request's response carries an RFC 9457
    /// `application/problem+json` body naming the violated policies.
    pub problem_body: bool,
    /// `RESPONSE_DYNAMIC_METADATA`: the response carries the reference's dynamic metadata
    /// (`metadata.rs`).
    pub dynamic_metadata: bool,
    /// `RESPONSE_RULE_METADATA`: the response's dynamic metadata names the rules that denied
    /// the request, and those that would have but are in shadow mode (`denied.rs`).
    pub rule_metadata: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub stop_increment_when_over_limit: bool,
    /// `NEAR_LIMIT_RATIO`: counts past this share of the limit are "near limit" in metrics.
    pub near_limit_ratio: f64,
    /// `EXACT_BELOW`: in global mode, a rule each of whose limits holds fewer hits than this
    /// (a window's `requests_per_unit`, a bucket's burst, a concurrency limit's places) is
    /// decided as `exact: true` decides it; 0 turns that off.
    pub exact_below: u32,
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest key or value, in bytes.
    pub max_value_bytes: usize,
    /// Limits of the entity table.
    pub cache: CacheSettings,
    /// Bounds of the metric series made from client input.
    pub metric_series: SeriesBounds,
    /// `METRICS_OVERRIDE_SERIES`: each of a rule's `overrides` has a metric series of its own
    /// (as a descriptor for that value alone would); off, its hits count in the rule's.
    pub override_series: bool,
    /// `DECISION_LOG_RATE`: decision lines sampled at info, a second (0: none).
    pub decision_log_rate: u32,
    /// `DECISION_LOG_VALUES`: decision lines carry the descriptors' values, not only keys.
    pub decision_log_values: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            shadow_mode: false,
            quota_mode: false,
            exact_below: EXACT_BELOW,
            override_series: true,
            decision_log_rate: 0,
            decision_log_values: false,
            response_headers: None,
            header_format: HeaderFormat::Reference,
            problem_body: false,
            dynamic_metadata: false,
            rule_metadata: false,
            stop_increment_when_over_limit: false,
            near_limit_ratio: 0.8,
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 4096,
            cache: CacheSettings::default(),
            metric_series: SeriesBounds::default(),
        }
    }
}

impl Options {
    /// Whether responses name each limited descriptor's policy: the IETF headers or the
    /// problem body are on.
    pub(super) fn wants_policies(&self) -> bool {
        self.problem_body
            || (self.response_headers.is_some() && self.header_format == HeaderFormat::Ietf)
    }
}
