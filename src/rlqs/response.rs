//! What a stream sends back, and the bucket ids it keeps to send: each tracked bucket's id is
//! kept once, as its `BucketId` message's bytes ([`StoredId`]), and each bucket action is
//! encoded into the `RateLimitQuotaResponse`'s bytes as it is made ([`Actions`]), the id
//! copied in as those bytes.
//!
//! Every action must carry its bucket's id, so the id is on the wire once per action whatever
//! the stream keeps. envoy-types' `BucketId` is a hash map of two strings an entry: a small id
//! takes several hundred bytes in it, in a dozen allocations, and each `BucketAction` needs a
//! `BucketId` of its own. Encoded, an id takes its bytes and a few more in one allocation, and
//! an action costs a copy of them.

use std::fmt;

use bytes::{BufMut, Bytes};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
use prost::encoding::{decode_varint, encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;

use super::report::text_len;
use super::share::{strategy_proto, Assignment};

/// A bucket id as a `BucketId` message's bytes: its entries in key order, each a map entry of
/// `key` = 1 and `value` = 2 in field 1. Made from checked entries (keys distinct, none
/// empty), so it reads back as the same map, however the client ordered its own.
pub struct StoredId(Box<[u8]>);

/// Tag 1, length-delimited: a map entry in `BucketId`, a key in the entry, a `BucketAction`
/// in `RateLimitQuotaResponse` and a `bucket_id` in `BucketAction`.
const FIELD_1: u8 = 0x0a;
/// Tag 2, length-delimited: a value in the map entry.
const FIELD_2: u8 = 0x12;

/// The bytes of a length-delimited field of `len` bytes, its tag and length included.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

// === impl StoredId ===

impl StoredId {
    /// The id of `entries`, checked and sorted by key (`Report::bucket`).
    pub fn new(entries: &[(&str, &str)]) -> StoredId {
        let entry_len = |k: &str, v: &str| field_len(k.len()) + field_len(v.len());
        let len = entries
            .iter()
            .map(|(k, v)| field_len(entry_len(k, v)))
            .sum();
        let mut buf = Vec::with_capacity(len);
        for (k, v) in entries {
            buf.put_u8(FIELD_1);
            encode_varint(entry_len(k, v) as u64, &mut buf);
            for (tag, s) in [(FIELD_1, k), (FIELD_2, v)] {
                buf.put_u8(tag);
                encode_varint(s.len() as u64, &mut buf);
                buf.put_slice(s.as_bytes());
            }
        }
        StoredId(buf.into_boxed_slice())
    }

    /// Its entries, in key order.
    pub fn entries(&self) -> Entries<'_> {
        Entries(&self.0)
    }

    /// The bytes of its keys and values: what the id bounds count.
    pub fn text_len(&self) -> usize {
        text_len(self.entries())
    }
}

/// A [`StoredId`]'s entries, read back from its bytes.
pub struct Entries<'a>(&'a [u8]);

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        // `StoredId::new` wrote these bytes, so every read succeeds; a failed one ends the
        // entries rather than panic.
        let mut entry = field(&mut self.0, FIELD_1)?;
        let key = field(&mut entry, FIELD_1)?;
        let value = field(&mut entry, FIELD_2)?;
        Some((
            std::str::from_utf8(key).ok()?,
            std::str::from_utf8(value).ok()?,
        ))
    }
}

/// The next field of `buf`, which must be the length-delimited one whose key byte is `key`.
fn field<'a>(buf: &mut &'a [u8], key: u8) -> Option<&'a [u8]> {
    let (&first, mut rest) = buf.split_first()?;
    if first != key {
        return None;
    }
    let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
    let (body, rest) = rest.split_at_checked(len)?;
    *buf = rest;
    Some(body)
}

/// Bucket actions to send, as the bytes of the `RateLimitQuotaResponse` that carries them in
/// the order they were added.
#[derive(Default)]
pub struct Actions {
    buf: Vec<u8>,
    count: usize,
}

// === impl Actions ===

impl Actions {
    /// Adds the assignment `a` of the bucket `id`.
    pub fn assign(&mut self, id: &StoredId, a: &Assignment) {
        let action = QuotaAssignmentAction {
            assignment_time_to_live: Some(a.ttl_proto()),
            rate_limit_strategy: Some(strategy_proto(&a.strategy)),
        };
        self.push(id, 2, &action);
    }

    /// Adds the abandon action of the bucket `id`.
    pub fn abandon(&mut self, id: &StoredId) {
        self.push(id, 3, &AbandonAction {});
    }

    /// A `BucketAction` of `bucket_id` = 1 and the `action` of its oneof at `tag`.
    fn push(&mut self, id: &StoredId, tag: u32, action: &impl Message) {
        let len = field_len(id.0.len()) + prost::encoding::message::encoded_len(tag, action);
        let buf = &mut self.buf;
        buf.reserve(field_len(len));
        buf.put_u8(FIELD_1);
        encode_varint(len as u64, buf);
        buf.put_u8(FIELD_1);
        encode_varint(id.0.len() as u64, buf);
        buf.put_slice(&id.0);
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(action.encoded_len() as u64, buf);
        action.encode_raw(buf);
        self.count += 1;
    }

    /// How many actions.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The response's bytes, as the transport sends them.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from(self.buf)
    }

    /// The actions decoded, as Envoy reads them (the simulator's Envoys, the tests).
    pub fn to_proto(&self) -> Vec<BucketAction> {
        RateLimitQuotaResponse::decode(&self.buf[..])
            .map(|r| r.bucket_action)
            .unwrap_or_default()
    }
}

impl fmt::Debug for Actions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.to_proto()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

    use super::*;
    use crate::rlqs::share::Strategy;

    fn map(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn a_stored_id_is_the_bucket_id_message_and_reads_back_its_entries() {
        // A value past 127 bytes takes a two-byte length.
        let long = "v".repeat(300);
        let entries = [
            ("name", "prod"),
            ("route", long.as_str()),
            ("tenant", "t-1"),
        ];
        let id = StoredId::new(&entries);
        assert_eq!(id.entries().collect::<Vec<_>>(), entries);
        assert_eq!(id.text_len(), 4 + 4 + 5 + 300 + 6 + 3);
        let decoded = BucketId::decode(&id.0[..]).unwrap();
        assert_eq!(decoded.bucket, map(&entries));
    }

    #[test]
    fn actions_are_the_response_prost_decodes_in_order() {
        let (a, b) = (
            StoredId::new(&[("tenant", "acme")]),
            StoredId::new(&[("method", "GET"), ("tenant", "beta")]),
        );
        let deny = Assignment {
            strategy: Strategy::DenyAll,
            ttl_s: 7,
        };
        let bucket = Assignment {
            strategy: Strategy::TokenBucket {
                max_tokens: 200,
                tokens_per_fill: 3,
                fill_interval_s: 2,
            },
            ttl_s: 15,
        };
        let mut actions = Actions::default();
        actions.assign(&a, &deny);
        actions.abandon(&b);
        actions.assign(&b, &bucket);
        assert_eq!(actions.len(), 3);
        let assignment = |x: &Assignment| {
            Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(x.ttl_proto()),
                rate_limit_strategy: Some(strategy_proto(&x.strategy)),
            }))
        };
        let action = |id: &[(&str, &str)], bucket_action| BucketAction {
            bucket_id: Some(BucketId { bucket: map(id) }),
            bucket_action,
        };
        let beta = [("method", "GET"), ("tenant", "beta")];
        assert_eq!(
            actions.to_proto(),
            [
                action(&[("tenant", "acme")], assignment(&deny)),
                action(&beta, Some(Action::AbandonAction(AbandonAction {}))),
                action(&beta, assignment(&bucket)),
            ]
        );
        assert!(Actions::default().into_bytes().is_empty());
    }
}
