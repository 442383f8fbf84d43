//! A limit's unit between the rules' names ([`Unit`]) and the RLS protocol's ([`PbUnit`]):
//! one table, read one way by `resolve.rs` (a request-supplied limit's unit) and the other by
//! `respond.rs` (a status's `current_limit`), so the two directions cannot drift apart.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;

use crate::rules::Unit;

/// Every unit the rules know, and its protocol twin.
const UNITS: [(Unit, PbUnit); 7] = [
    (Unit::Second, PbUnit::Second),
    (Unit::Minute, PbUnit::Minute),
    (Unit::Hour, PbUnit::Hour),
    (Unit::Day, PbUnit::Day),
    (Unit::Week, PbUnit::Week),
    (Unit::Month, PbUnit::Month),
    (Unit::Year, PbUnit::Year),
];

/// A rule's unit as the protocol names it.
pub(super) fn to_pb(u: Unit) -> PbUnit {
    UNITS
        .iter()
        .find(|(r, _)| *r == u)
        .map_or(PbUnit::Second, |&(_, pb)| pb)
}

/// A request-supplied limit's unit as the rules name it; an unknown unit (`validate.rs`
/// refuses it) reads as seconds.
pub(super) fn from_pb(u: PbUnit) -> Unit {
    UNITS
        .iter()
        .find(|(_, pb)| *pb == u)
        .map_or(Unit::Second, |&(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_goes_there_and_back_and_unknown_reads_as_seconds() {
        for (unit, pb) in UNITS {
            assert_eq!(from_pb(to_pb(unit)), unit);
            assert_eq!(to_pb(from_pb(pb)), pb);
        }
        assert_eq!(from_pb(PbUnit::Unknown), Unit::Second);
    }
}
