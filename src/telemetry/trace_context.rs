//! The caller's trace context, read from request headers as the reference's propagators
//! read it (W3C `traceparent`, then B3 single and multi-header, a later one found
//! overriding), without allocating: what `otel.rs`'s tracer continues.

use opentelemetry::trace::{SpanId, TraceId};

/// A trace context read from request headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Remote {
    pub(super) trace_id: TraceId,
    pub(super) span_id: SpanId,
    /// From `traceparent`, so a `tracestate` goes with it.
    pub(super) is_w3c: bool,
}

/// What the request headers say about the caller's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Parent {
    /// No (valid) trace context: a root span, sampled at `TRACING_SAMPLING_RATE`.
    None,
    /// A parent that was not sampled (or left the decision open, which the reference's
    /// ParentBased sampler also reads as "not sampled"): no span.
    NotSampled,
    /// A sampled parent: a span in its trace.
    Sampled(Remote),
}

/// The caller's trace context, in the reference's propagator order (W3C, then B3, a later
/// one found overriding): `b3`, else `x-b3-traceid`/`x-b3-spanid`/`x-b3-sampled`/
/// `x-b3-flags`, else `traceparent`.
pub(super) fn extract<'h>(header: &impl Fn(&str) -> Option<&'h str>) -> Parent {
    if let Some(p) = header("b3").and_then(b3_single) {
        return p;
    }
    if let Some(p) = b3_multi(header) {
        return p;
    }
    header("traceparent")
        .and_then(traceparent)
        .unwrap_or(Parent::None)
}

/// `traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`; a later version may
/// append fields after another `-`.
fn traceparent(v: &str) -> Option<Parent> {
    let v = v.trim().as_bytes();
    if v.len() < 55 || (v.len() > 55 && (v[55] != b'-' || v.starts_with(b"00"))) {
        return None;
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' || v.starts_with(b"ff") {
        return None;
    }
    hex::<1>(&v[..2])?;
    let trace_id = TraceId::from_bytes(hex::<16>(&v[3..35])?);
    let span_id = SpanId::from_bytes(hex::<8>(&v[36..52])?);
    let flags = hex::<1>(&v[53..55])?[0];
    remote(trace_id, span_id, true, flags & 1 == 1)
}

/// `b3: {trace id}-{span id}[-{sampling}[-{parent span id}]]`, or `b3: {sampling}` alone.
fn b3_single(v: &str) -> Option<Parent> {
    let mut parts = v.trim().split('-');
    let first = parts.next()?;
    let Some(span) = parts.next() else {
        // Only a sampling decision: "0" means do not trace; anything else has no parent.
        return Some(if first == "0" {
            Parent::NotSampled
        } else {
            Parent::None
        });
    };
    let sampled = match parts.next() {
        Some("1" | "d") => true,
        Some("0") | None => false,
        Some(_) => return None,
    };
    remote(b3_trace_id(first)?, b3_span_id(span)?, false, sampled)
}

/// The multi-header B3 form; `None` when `x-b3-traceid` is absent.
fn b3_multi<'h>(header: &impl Fn(&str) -> Option<&'h str>) -> Option<Parent> {
    let trace = header("x-b3-traceid")?;
    let span = header("x-b3-spanid")?;
    let debug = header("x-b3-flags").is_some_and(|f| f.trim() == "1");
    let sampled = debug
        || header("x-b3-sampled")
            .is_some_and(|s| matches!(s.trim(), "1") || s.trim().eq_ignore_ascii_case("true"));
    remote(
        b3_trace_id(trace.trim())?,
        b3_span_id(span.trim())?,
        false,
        sampled,
    )
}

/// A B3 trace id: 32 hex digits, or 16 (the high half zero).
fn b3_trace_id(s: &str) -> Option<TraceId> {
    let s = s.as_bytes();
    let bytes = match s.len() {
        32 => hex::<16>(s)?,
        16 => {
            let mut b = [0u8; 16];
            b[8..].copy_from_slice(&hex::<8>(s)?);
            b
        }
        _ => return None,
    };
    Some(TraceId::from_bytes(bytes))
}

fn b3_span_id(s: &str) -> Option<SpanId> {
    Some(SpanId::from_bytes(hex::<8>(s.as_bytes())?))
}

/// A valid remote parent (ids not all zero), sampled or not.
fn remote(trace_id: TraceId, span_id: SpanId, is_w3c: bool, sampled: bool) -> Option<Parent> {
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    Some(if sampled {
        Parent::Sampled(Remote {
            trace_id,
            span_id,
            is_w3c,
        })
    } else {
        Parent::NotSampled
    })
}

/// Exactly `2 * N` lowercase or uppercase hex digits as `N` bytes, without allocating.
fn hex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(h: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |name| h.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    fn sampled(trace: &str, span: &str) -> Parent {
        Parent::Sampled(Remote {
            trace_id: TraceId::from_hex(trace).unwrap(),
            span_id: SpanId::from_hex(span).unwrap(),
            is_w3c: false,
        })
    }

    #[test]
    fn traceparent_is_read_and_checked() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let Parent::Sampled(r) = extract(&headers(&[("traceparent", tp)])) else {
            panic!("sampled");
        };
        assert_eq!(
            r.trace_id,
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(r.span_id, SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert!(r.is_w3c);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(
            extract(&headers(&[("traceparent", unsampled)])),
            Parent::NotSampled
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(
                extract(&headers(&[("traceparent", bad)])),
                Parent::None,
                "{bad}"
            );
        }
        // A later version may carry more fields.
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert!(matches!(
            extract(&headers(&[("traceparent", v1)])),
            Parent::Sampled(_)
        ));
    }

    #[test]
    fn b3_single_and_multi_are_read() {
        let t = "80f198ee56343ba864fe8b2a57d3eff7";
        let s = "e457b5a2e4d86bd1";
        assert_eq!(
            extract(&headers(&[("b3", &format!("{t}-{s}-1-05e3ac9a4f6e3b90"))])),
            sampled(t, s)
        );
        assert_eq!(
            extract(&headers(&[("b3", &format!("{t}-{s}-0"))])),
            Parent::NotSampled
        );
        assert_eq!(extract(&headers(&[("b3", "0")])), Parent::NotSampled);
        assert_eq!(
            extract(&headers(&[("b3", &format!("64fe8b2a57d3eff7-{s}-d"))])),
            sampled("000000000000000064fe8b2a57d3eff7", s)
        );
        let multi = [
            ("x-b3-traceid", t),
            ("x-b3-spanid", s),
            ("x-b3-sampled", "1"),
        ];
        assert_eq!(extract(&headers(&multi)), sampled(t, s));
        let debug = [("x-b3-traceid", t), ("x-b3-spanid", s), ("x-b3-flags", "1")];
        assert_eq!(extract(&headers(&debug)), sampled(t, s));
        let deferred = [("x-b3-traceid", t), ("x-b3-spanid", s)];
        assert_eq!(extract(&headers(&deferred)), Parent::NotSampled);
        // B3 is read after W3C in the reference, so it wins when both are present.
        let both = [
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("x-b3-traceid", t),
            ("x-b3-spanid", s),
            ("x-b3-sampled", "1"),
        ];
        assert_eq!(extract(&headers(&both)), sampled(t, s));
        assert_eq!(extract(&headers(&[])), Parent::None);
    }
}
