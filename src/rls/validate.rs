//! Step 1 of a request: reject what is malformed or past the configured bounds, before
//! anything is looked up or counted.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::{Options, RequestError};

/// Checks `req` against the wire rules (docs/wire.md) and the bounds in `o`.
///
/// # Errors
/// The first problem found.
pub(super) fn validate(o: &Options, req: &RateLimitRequest) -> Result<(), RequestError> {
    if req.domain.is_empty() {
        return Err(RequestError::EmptyDomain);
    }
    if req.descriptors.is_empty() {
        return Err(RequestError::NoDescriptors);
    }
    if req.descriptors.len() > o.max_descriptors {
        return Err(RequestError::TooManyDescriptors {
            count: req.descriptors.len(),
            max: o.max_descriptors,
        });
    }
    if req.domain.len() > o.max_value_bytes {
        return Err(RequestError::ValueTooLong {
            index: 0,
            len: req.domain.len(),
            max: o.max_value_bytes,
        });
    }
    for (index, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > o.max_entries {
            return Err(RequestError::TooManyEntries {
                index,
                count: d.entries.len(),
                max: o.max_entries,
            });
        }
        let len = d
            .entries
            .iter()
            .map(|e| e.key.len().max(e.value.len()))
            .max()
            .unwrap_or(0);
        if len > o.max_value_bytes {
            return Err(RequestError::ValueTooLong {
                index,
                len,
                max: o.max_value_bytes,
            });
        }
        if let Some(l) = &d.limit {
            if !matches!(PbUnit::try_from(l.unit), Ok(u) if u != PbUnit::Unknown) {
                return Err(RequestError::BadOverrideUnit {
                    index,
                    unit: l.unit,
                });
            }
        }
    }
    Ok(())
}
