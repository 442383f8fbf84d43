//! The RLS method's codec: `RateLimitRequest` read by hand (prost's reading of the same bytes
//! whenever this one declines), `RateLimitResponse` written by hand into tonic's buffer.
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

use bytes::{Buf, BufMut, Bytes};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, Quota, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, UInt64Value, Value};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

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
const FIXED64: u8 = 1;
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

/// Writes `resp`, as prost would encode it, into `dst`.
pub fn encode_response(resp: &RateLimitResponse, dst: &mut impl BufMut) {
    let mut sizes = Sizes::default();
    let len = Measure(&mut sizes).response(resp);
    // A stack buffer for the usual response (a few statuses), so the message is one copy
    // into the frame and no allocation.
    let mut stack = [0u8; 256];
    let mut heap = Vec::new();
    let out = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap[..]
    };
    write(resp, &sizes, out);
    dst.put_slice(out);
}

/// `resp` as a gRPC message frame: the uncompressed flag, the length (big-endian), the
/// message as [`encode_response`] writes it; one allocation, the frame's own.
pub fn frame_response(resp: &RateLimitResponse) -> Bytes {
    let mut sizes = Sizes::default();
    let len = Measure(&mut sizes).response(resp);
    let mut frame = vec![0u8; 5 + len];
    // Past u32::MAX the length would wrap: tonic's encoder writes such a message as a
    // frame of its own, so it is left to tonic (never a rate-limit response's size).
    let prefix = u32::try_from(len).expect("a response under 4 GiB");
    frame[1..5].copy_from_slice(&prefix.to_be_bytes());
    write(resp, &sizes, &mut frame[5..]);
    Bytes::from(frame)
}

/// The second pass into `out`, exactly the measured length.
fn write(resp: &RateLimitResponse, sizes: &Sizes, out: &mut [u8]) {
    let mut w = Write {
        out,
        at: 0,
        sizes,
        next: 0,
    };
    w.response(resp);
    debug_assert_eq!(w.at, w.out.len(), "measured and written lengths differ");
}

/// Nested messages' lengths in the order both passes visit them: measured once, read back
/// while writing.
#[derive(Default)]
struct Sizes {
    first: [usize; 16],
    rest: Vec<usize>,
    n: usize,
}

impl Sizes {
    fn reserve(&mut self) -> usize {
        let i = self.n;
        self.n += 1;
        if i >= self.first.len() {
            self.rest.push(0);
        }
        i
    }

    fn set(&mut self, i: usize, len: usize) {
        match self.first.get_mut(i) {
            Some(s) => *s = len,
            None => self.rest[i - self.first.len()] = len,
        }
    }

    fn get(&self, i: usize) -> usize {
        match self.first.get(i) {
            Some(s) => *s,
            None => self.rest[i - self.first.len()],
        }
    }
}

/// A varint's length (prost's formula).
fn varint_len(v: u64) -> usize {
    (((v | 1).leading_zeros() ^ 63) * 9 + 73) as usize / 64
}

/// A key's length: field numbers here are below 16, one byte.
const KEY: usize = 1;

/// An int32 (or enum) as protobuf writes it: sign-extended to 64 bits.
fn int32(v: i32) -> u64 {
    i64::from(v) as u64
}

/// The first pass: each message's length, nested ones recorded in `Sizes`.
struct Measure<'s>(&'s mut Sizes);

impl Measure<'_> {
    /// A nested message's field: its key, length and body, the body measured by `body`.
    fn nested(&mut self, body: impl FnOnce(&mut Self) -> usize) -> usize {
        let i = self.0.reserve();
        let len = body(self);
        self.0.set(i, len);
        KEY + varint_len(len as u64) + len
    }

    fn response(&mut self, r: &RateLimitResponse) -> usize {
        let mut n = scalar(int32(r.overall_code));
        for s in &r.statuses {
            n += self.nested(|m| m.status(s));
        }
        for h in r
            .response_headers_to_add
            .iter()
            .chain(&r.request_headers_to_add)
        {
            n += self.nested(|_| header(h));
        }
        n += bytes(r.raw_body.len());
        if let Some(s) = &r.dynamic_metadata {
            n += self.nested(|m| m.structure(s));
        }
        if let Some(q) = &r.quota {
            n += self.nested(|m| m.quota(q));
        }
        n
    }

    fn status(&mut self, s: &DescriptorStatus) -> usize {
        let mut n = scalar(int32(s.code));
        if let Some(l) = &s.current_limit {
            n += self.nested(|_| rate_limit(l));
        }
        n += scalar(u64::from(s.limit_remaining));
        if let Some(d) = &s.duration_until_reset {
            n += self.nested(|_| seconds_nanos(d.seconds, d.nanos));
        }
        if let Some(q) = &s.quota {
            n += self.nested(|m| m.quota(q));
        }
        n
    }

    fn quota(&mut self, q: &Quota) -> usize {
        let mut n = scalar(u64::from(q.requests));
        if let Some(ExpirationSpecifier::ValidUntil(t)) = &q.expiration_specifier {
            n += self.nested(|_| seconds_nanos(t.seconds, t.nanos));
        }
        n + bytes(q.id.len())
    }

    fn structure(&mut self, s: &Struct) -> usize {
        let mut n = 0;
        for (k, v) in &s.fields {
            n += self.nested(|m| {
                let value = if v.kind.is_some() {
                    m.nested(|m| m.value(v))
                } else {
                    0
                };
                bytes(k.len()) + value
            });
        }
        n
    }

    fn value(&mut self, v: &Value) -> usize {
        match &v.kind {
            None => 0,
            Some(Kind::NullValue(x)) => KEY + varint_len(int32(*x)),
            Some(Kind::NumberValue(_)) => KEY + 8,
            Some(Kind::StringValue(s)) => KEY + varint_len(s.len() as u64) + s.len(),
            Some(Kind::BoolValue(_)) => KEY + 1,
            Some(Kind::StructValue(s)) => self.nested(|m| m.structure(s)),
            Some(Kind::ListValue(l)) => self.nested(|m| m.list(l)),
        }
    }

    fn list(&mut self, l: &ListValue) -> usize {
        let mut n = 0;
        for v in &l.values {
            n += self.nested(|m| m.value(v));
        }
        n
    }
}

/// A proto3 scalar varint field: nothing when 0.
fn scalar(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        KEY + varint_len(v)
    }
}

/// A proto3 string or bytes field of `len` bytes: nothing when empty.
fn bytes(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        KEY + varint_len(len as u64) + len
    }
}

fn rate_limit(l: &RateLimit) -> usize {
    scalar(u64::from(l.requests_per_unit)) + scalar(int32(l.unit)) + bytes(l.name.len())
}

fn header(h: &HeaderValue) -> usize {
    bytes(h.key.len()) + bytes(h.value.len()) + bytes(h.raw_value.len())
}

/// `Duration` and `Timestamp`: seconds 1 (int64), nanos 2 (int32).
fn seconds_nanos(seconds: i64, nanos: i32) -> usize {
    scalar(seconds as u64) + scalar(int32(nanos))
}

/// The second pass: the bytes, nested lengths taken from `sizes` in the first pass's order.
struct Write<'a> {
    out: &'a mut [u8],
    at: usize,
    sizes: &'a Sizes,
    next: usize,
}

impl Write<'_> {
    fn byte(&mut self, b: u8) {
        self.out[self.at] = b;
        self.at += 1;
    }

    fn raw(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    fn key(&mut self, tag: u8, wire: u8) {
        self.byte(tag << 3 | wire);
    }

    fn scalar(&mut self, tag: u8, v: u64) {
        if v != 0 {
            self.key(tag, VARINT);
            self.varint(v);
        }
    }

    fn bytes(&mut self, tag: u8, b: &[u8]) {
        if !b.is_empty() {
            self.delimited(tag, b);
        }
    }

    fn delimited(&mut self, tag: u8, b: &[u8]) {
        self.key(tag, DELIMITED);
        self.varint(b.len() as u64);
        self.raw(b);
    }

    /// A nested message's key and measured length, then its body.
    fn nested(&mut self, tag: u8, body: impl FnOnce(&mut Self)) {
        let len = self.sizes.get(self.next);
        self.next += 1;
        self.key(tag, DELIMITED);
        self.varint(len as u64);
        body(self);
    }

    fn response(&mut self, r: &RateLimitResponse) {
        self.scalar(1, int32(r.overall_code));
        for s in &r.statuses {
            self.nested(2, |w| w.status(s));
        }
        for h in &r.response_headers_to_add {
            self.nested(3, |w| w.header(h));
        }
        for h in &r.request_headers_to_add {
            self.nested(4, |w| w.header(h));
        }
        self.bytes(5, &r.raw_body);
        if let Some(s) = &r.dynamic_metadata {
            self.nested(6, |w| w.structure(s));
        }
        if let Some(q) = &r.quota {
            self.nested(7, |w| w.quota(q));
        }
    }

    fn status(&mut self, s: &DescriptorStatus) {
        self.scalar(1, int32(s.code));
        if let Some(l) = &s.current_limit {
            self.nested(2, |w| {
                w.scalar(1, u64::from(l.requests_per_unit));
                w.scalar(2, int32(l.unit));
                w.bytes(3, l.name.as_bytes());
            });
        }
        self.scalar(3, u64::from(s.limit_remaining));
        if let Some(d) = &s.duration_until_reset {
            self.nested(4, |w| w.seconds_nanos(d.seconds, d.nanos));
        }
        if let Some(q) = &s.quota {
            self.nested(5, |w| w.quota(q));
        }
    }

    fn header(&mut self, h: &HeaderValue) {
        self.bytes(1, h.key.as_bytes());
        self.bytes(2, h.value.as_bytes());
        self.bytes(3, &h.raw_value);
    }

    fn seconds_nanos(&mut self, seconds: i64, nanos: i32) {
        self.scalar(1, seconds as u64);
        self.scalar(2, int32(nanos));
    }

    fn quota(&mut self, q: &Quota) {
        self.scalar(1, u64::from(q.requests));
        if let Some(ExpirationSpecifier::ValidUntil(t)) = &q.expiration_specifier {
            self.nested(2, |w| w.seconds_nanos(t.seconds, t.nanos));
        }
        self.bytes(3, q.id.as_bytes());
    }

    /// A map entry per field: key 1 unless empty, value 2 unless it has no kind (prost's
    /// rule for a map's default key and value).
    fn structure(&mut self, s: &Struct) {
        for (k, v) in &s.fields {
            self.nested(1, |w| {
                w.bytes(1, k.as_bytes());
                if v.kind.is_some() {
                    w.nested(2, |w| w.value(v));
                }
            });
        }
    }

    /// A oneof's member is written whatever its value.
    fn value(&mut self, v: &Value) {
        match &v.kind {
            None => {}
            Some(Kind::NullValue(x)) => {
                self.key(1, VARINT);
                self.varint(int32(*x));
            }
            Some(Kind::NumberValue(x)) => {
                self.key(2, FIXED64);
                self.raw(&x.to_le_bytes());
            }
            Some(Kind::StringValue(s)) => self.delimited(3, s.as_bytes()),
            Some(Kind::BoolValue(b)) => {
                self.key(4, VARINT);
                self.byte(u8::from(*b));
            }
            Some(Kind::StructValue(s)) => self.nested(5, |w| w.structure(s)),
            Some(Kind::ListValue(l)) => self.nested(6, |w| {
                for v in &l.values {
                    w.nested(1, |w| w.value(v));
                }
            }),
        }
    }
}

#[cfg(test)]
#[path = "rls_codec_tests.rs"]
mod tests;
