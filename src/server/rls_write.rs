//! `RateLimitResponse` written by hand, as prost writes it (fields in tag order, proto3
//! defaults left out, a map's entries in its iteration order): each nested message measured
//! once, then the bytes written into one buffer. prost measures a nested message again at
//! every level above it and writes field by field through `BufMut`: 2.0k instructions for a
//! one-status response, against 0.5k here (docs/performance.md). `rls_codec_tests.rs` holds
//! the bytes to prost's.

use bytes::{BufMut, Bytes};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, Quota, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const DELIMITED: u8 = 2;

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
