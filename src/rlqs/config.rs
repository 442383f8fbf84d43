//! The quota service's settings (`rlqs::Config`), built by `settings/` from the `RLQS_*`
//! variables: its bounds, the assignments' TTL, when idle buckets are abandoned, and what a
//! bucket without a rule gets.

use std::collections::HashMap;
use std::time::Duration;

use super::share::Strategy;

/// The quota service's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Streams open at once (`RLQS_MAX_STREAMS`); a stream past it ends with
    /// `RESOURCE_EXHAUSTED`.
    pub max_streams: usize,
    /// Buckets one stream may have tracked (`RLQS_MAX_BUCKETS_PER_STREAM`).
    pub max_buckets_per_stream: usize,
    /// Buckets tracked, every stream together (`RLQS_MAX_BUCKETS`).
    pub max_buckets: usize,
    /// Bytes of one bucket id's keys and values together (`RLQS_MAX_BUCKET_ID_BYTES`); a report
    /// with a longer one ends the stream with `INVALID_ARGUMENT`.
    pub max_bucket_id_bytes: usize,
    /// Bytes of the keys and values of every tracked bucket's id, every stream together
    /// (`RLQS_MAX_TRACKED_ID_BYTES`).
    pub max_tracked_id_bytes: usize,
    /// How long an assignment lasts in Envoy unless renewed (`RLQS_ASSIGNMENT_TTL`): what
    /// Envoy keeps enforcing when it loses sluice.
    pub assignment_ttl: Duration,
    /// A bucket with no request for this long is abandoned (`RLQS_ABANDON_AFTER`).
    pub abandon_after: Duration,
    /// What a bucket without a rule gets (`RLQS_UNKNOWN_BUCKETS`).
    pub unknown: UnknownBuckets,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_streams: 4096,
            max_buckets_per_stream: 10_000,
            max_buckets: 200_000,
            max_bucket_id_bytes: 1024,
            max_tracked_id_bytes: 64 << 20,
            assignment_ttl: Duration::from_secs(15),
            abandon_after: Duration::from_secs(600),
            unknown: UnknownBuckets::default(),
        }
    }
}

/// What a bucket that no rule matches gets: allow-all or deny-all, per domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBuckets {
    /// Every domain not named.
    pub default: Strategy,
    /// Domains with their own.
    pub domains: HashMap<String, Strategy>,
}

impl Default for UnknownBuckets {
    fn default() -> Self {
        UnknownBuckets {
            default: Strategy::AllowAll,
            domains: HashMap::new(),
        }
    }
}

/// Why `RLQS_UNKNOWN_BUCKETS` is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not ALLOW_ALL or DENY_ALL (expected `ACTION` or `domain=ACTION,...`, `*=ACTION` for every other domain)")]
pub struct UnknownBucketsError(pub String);

impl UnknownBuckets {
    /// What a bucket of `domain` without a rule gets.
    pub fn for_domain(&self, domain: &str) -> Strategy {
        self.domains.get(domain).copied().unwrap_or(self.default)
    }

    /// Parses `ALLOW_ALL`, `DENY_ALL`, or a list of `domain=ACTION` with `*` for the rest.
    ///
    /// # Errors
    /// An action other than the two, or an empty domain.
    pub fn parse(s: &str) -> Result<UnknownBuckets, UnknownBucketsError> {
        let action = |a: &str| match a.trim().to_ascii_uppercase().as_str() {
            "ALLOW_ALL" => Ok(Strategy::AllowAll),
            "DENY_ALL" => Ok(Strategy::DenyAll),
            _ => Err(UnknownBucketsError(a.trim().to_string())),
        };
        let mut out = UnknownBuckets::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                None => out.default = action(part)?,
                Some((d, a)) if d.trim() == "*" => out.default = action(a)?,
                Some((d, a)) if !d.trim().is_empty() => {
                    out.domains.insert(d.trim().to_string(), action(a)?);
                }
                Some(_) => return Err(UnknownBucketsError(part.to_string())),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_buckets_parse_one_action_or_one_per_domain() {
        assert_eq!(
            UnknownBuckets::parse("").unwrap(),
            UnknownBuckets::default()
        );
        let deny = UnknownBuckets::parse("deny_all").unwrap();
        assert_eq!(deny.for_domain("any"), Strategy::DenyAll);
        let mixed = UnknownBuckets::parse("edge=DENY_ALL, *=ALLOW_ALL").unwrap();
        assert_eq!(mixed.for_domain("edge"), Strategy::DenyAll);
        assert_eq!(mixed.for_domain("other"), Strategy::AllowAll);
        assert!(UnknownBuckets::parse("edge=RATE").is_err());
        assert!(UnknownBuckets::parse("=DENY_ALL").is_err());
        assert!(UnknownBuckets::parse("TOKEN_BUCKET").is_err());
    }
}
