//! The RLS method's codec: `RateLimitRequest` read by hand (prost's reading of the same bytes
//! whenever this one declines), `RateLimitResponse` written by hand into tonic's buffer
//! (`rls_write.rs`).
//!
//! Why: prost's generic decoding and encoding were the largest costs of a request that the
//! limiter does not own (about 2.8k and 2.0k instructions, docs/performance.md). The reader
//! here walks one contiguous slice with no per-field calls through `Buf`; the writer measures
//! every nested message once (prost measures each again at every level above it) and copies
//! the finished message into the gRPC frame in one write.
//!
//! Semantics are prost's by construction: the reader returns a message only for input it
//! understands entirely (the fields sluice's request has, unknown fields of wire types 0, 1,
//! 2 and 5 skipped, prost's rules for repeated, merged and last-wins fields) and declines
//! everything else — groups, a wrong wire type, a bad varint or UTF-8, a truncation — which
//! prost then decodes, so a malformed request gets prost's own `INTERNAL` error, word for
//! word. The writer emits prost's bytes: fields in tag order, proto3 defaults left out, a
//! map's entries in its iteration order (`rls_codec_tests.rs` holds both to prost).

use bytes::Buf;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use crate::server::rls_write::encode_response;

/// `ShouldRateLimit`'s codec: requests in, responses out.
#[derive(Debug, Clone, Copy, Default)]
pub struct RlsCodec;

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = RlsCodec;
    type Decoder = RlsCodec;

    fn encoder(&mut self) -> RlsCodec {
        RlsCodec
    }

    fn decoder(&mut self) -> RlsCodec {
        RlsCodec
    }
}

impl Decoder for RlsCodec {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        decode_request(src).map(Some)
    }
}

impl Encoder for RlsCodec {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: RateLimitResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode_response(&item, dst);
        Ok(())
    }
}

/// The request in `src` (all of it), as prost would decode it; prost's error as tonic's
/// prost codec reports it (`INTERNAL`, the error's text) when the bytes are malformed.
pub fn decode_request(src: &mut impl Buf) -> Result<RateLimitRequest, Status> {
    let n = src.remaining();
    let read = (src.chunk().len() == n)
        .then(|| request(src.chunk()))
        .and_then(Result::ok);
    match read {
        Some(req) => {
            src.advance(n);
            Ok(req)
        }
        None => RateLimitRequest::decode(src).map_err(|e| Status::internal(e.to_string())),
    }
}

/// A reason to hand the bytes to prost (which says what is wrong, or reads what this does
/// not: groups).
#[derive(Debug)]
pub(crate) struct Declined;

type Read<T> = Result<T, Declined>;

/// A cursor over one message's bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }

    fn more(&self) -> bool {
        self.at < self.b.len()
    }

    /// A varint, by prost's rule: at most ten bytes, the tenth at most 1.
    fn varint(&mut self) -> Read<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = *self.b.get(self.at).ok_or(Declined)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return if i == 9 && byte > 1 {
                    Err(Declined)
                } else {
                    Ok(value)
                };
            }
        }
        Err(Declined)
    }

    /// A field's number and wire type; prost refuses keys above `u32::MAX`, wire types 6 and
    /// 7, and field number 0.
    fn key(&mut self) -> Read<(u32, u8)> {
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| Declined)?;
        let (tag, wire) = (key >> 3, (key & 7) as u8);
        if tag == 0 || wire > 5 {
            return Err(Declined);
        }
        Ok((tag, wire))
    }

    /// A length-delimited field's bytes.
    fn delimited(&mut self) -> Read<&'a [u8]> {
        let len = self.varint()?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| self.at.checked_add(l))
            .filter(|&end| end <= self.b.len())
            .ok_or(Declined)?;
        let bytes = &self.b[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn string(&mut self) -> Read<String> {
        let bytes = self.delimited()?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| Declined)
    }

    fn skip_fixed(&mut self, n: usize) -> Read<()> {
        if self.b.len() - self.at < n {
            return Err(Declined);
        }
        self.at += n;
        Ok(())
    }

    /// Skips an unknown field; groups (wire types 3 and 4) are left to prost.
    fn skip(&mut self, wire: u8) -> Read<()> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.skip_fixed(8),
            2 => self.delimited().map(drop),
            5 => self.skip_fixed(4),
            _ => Err(Declined),
        }
    }
}

/// Wire types.
const VARINT: u8 = 0;
const DELIMITED: u8 = 2;

/// `RateLimitRequest`: domain 1, descriptors 2, hits_addend 3.
pub(crate) fn request(b: &[u8]) -> Read<RateLimitRequest> {
    let mut req = RateLimitRequest::default();
    let mut r = Reader::new(b);
    while r.more() {
        match r.key()? {
            (1, DELIMITED) => req.domain = r.string()?,
            (2, DELIMITED) => req.descriptors.push(descriptor(r.delimited()?)?),
            (3, VARINT) => req.hits_addend = r.varint()? as u32,
            (1..=3, _) => return Err(Declined),
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok(req)
}

/// `RateLimitDescriptor`: entries 1, limit 2 and hits_addend 3 (messages merged when
/// repeated, as prost does), is_negative_hits 4.
fn descriptor(b: &[u8]) -> Read<RateLimitDescriptor> {
    let mut d = RateLimitDescriptor::default();
    let mut r = Reader::new(b);
    while r.more() {
        match r.key()? {
            (1, DELIMITED) => d.entries.push(entry(r.delimited()?)?),
            (2, DELIMITED) => limit(d.limit.get_or_insert_default(), r.delimited()?)?,
            (3, DELIMITED) => uint64(d.hits_addend.get_or_insert_default(), r.delimited()?)?,
            (4, VARINT) => d.is_negative_hits = r.varint()? != 0,
            (1..=4, _) => return Err(Declined),
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok(d)
}

/// `Entry`: key 1, value 2.
fn entry(b: &[u8]) -> Read<Entry> {
    let mut e = Entry::default();
    let mut r = Reader::new(b);
    while r.more() {
        match r.key()? {
            (1, DELIMITED) => e.key = r.string()?,
            (2, DELIMITED) => e.value = r.string()?,
            (1..=2, _) => return Err(Declined),
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok(e)
}

/// `RateLimitOverride`: requests_per_unit 1, unit 2 (an enum: int32, any value kept).
fn limit(o: &mut RateLimitOverride, b: &[u8]) -> Read<()> {
    let mut r = Reader::new(b);
    while r.more() {
        match r.key()? {
            (1, VARINT) => o.requests_per_unit = r.varint()? as u32,
            (2, VARINT) => o.unit = r.varint()? as i32,
            (1..=2, _) => return Err(Declined),
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok(())
}

/// `UInt64Value`: value 1.
fn uint64(v: &mut UInt64Value, b: &[u8]) -> Read<()> {
    let mut r = Reader::new(b);
    while r.more() {
        match r.key()? {
            (1, VARINT) => v.value = r.varint()?,
            (1, _) => return Err(Declined),
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "rls_codec_tests.rs"]
mod tests;
