//! OpenTelemetry export over OTLP: the tracer behind `TRACING_*` (one span per
//! ShouldRateLimit, continuing Envoy's trace from W3C or B3 headers) and the OTLP metrics
//! reader that sits next to the Prometheus one.
//!
//! Cost: with tracing off the service holds no [`Tracer`], so a request reads no header and
//! allocates nothing for it. With tracing on, a request whose parent says "not sampled" costs
//! a few header lookups and no SDK call; only sampled requests build a span.
//!
//! Both exporters run as tasks on the service's runtime (the SDK's async-runtime batch
//! processor and periodic reader): the hyper (HTTP) and tonic (gRPC) clients need it, and an
//! export failure is the SDK's to log and retry, never a panic here.

use std::str::FromStr;
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol as Wire, WithExportConfig as _};
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::MeterProviderBuilder;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

/// The span's name: the RPC it covers.
const SPAN_NAME: &str = "ShouldRateLimit";

/// How long the final flush of spans or metrics may take at shutdown before it is given up.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// How OTLP reaches the collector (`TRACING_EXPORTER_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (port 4318): the reference's default.
    Http,
    /// OTLP/gRPC (port 4317).
    Grpc,
}

impl Protocol {
    /// The endpoint when none is configured, per the OTLP exporter specification.
    fn default_endpoint(self) -> &'static str {
        match self {
            Protocol::Http => "http://localhost:4318",
            Protocol::Grpc => "http://localhost:4317",
        }
    }
}

/// The OTLP endpoints as the specification resolves them: a signal's own variable is used
/// as is; the common `OTEL_EXPORTER_OTLP_ENDPOINT` is a base URL to which OTLP/HTTP appends
/// `/v1/<signal>` (gRPC uses it as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub common: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`.
    pub traces: Option<String>,
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`.
    pub metrics: Option<String>,
}

impl Endpoints {
    fn resolve(&self, own: Option<&String>, path: &str, protocol: Protocol) -> String {
        if let Some(own) = own {
            return own.clone();
        }
        let base = self
            .common
            .as_deref()
            .unwrap_or(protocol.default_endpoint());
        match protocol {
            Protocol::Grpc => base.to_string(),
            Protocol::Http => format!("{}/{path}", base.trim_end_matches('/')),
        }
    }

    /// Where spans go.
    pub fn traces(&self, protocol: Protocol) -> String {
        self.resolve(self.traces.as_ref(), "v1/traces", protocol)
    }

    /// Where metrics go.
    pub fn metrics(&self, protocol: Protocol) -> String {
        self.resolve(self.metrics.as_ref(), "v1/metrics", protocol)
    }
}

/// The OTLP settings: `TRACING_*`, the endpoints, and whether metrics go out too.
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    /// `TRACING_ENABLED`: export a span per ShouldRateLimit.
    pub tracing: bool,
    /// `TRACING_EXPORTER_PROTOCOL`, for traces and metrics alike.
    pub protocol: Protocol,
    /// The collector's endpoints.
    pub endpoints: Endpoints,
    /// `TRACING_SERVICE_NAME`: the resource's `service.name`.
    pub service_name: String,
    /// `TRACING_SERVICE_NAMESPACE`: `service.namespace`, when not empty.
    pub service_namespace: String,
    /// `TRACING_SERVICE_INSTANCE_ID`: `service.instance.id`; a random UUID when unset.
    pub service_instance_id: Option<String>,
    /// `TRACING_SAMPLING_RATE`: share of root requests (no sampled parent) traced.
    pub sampling_rate: f64,
    /// `OTEL_METRICS_EXPORTER` lists `otlp`, or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set.
    pub metrics: bool,
}

/// Why an OTLP exporter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The span exporter's configuration was refused.
    #[error("OTLP trace exporter: {0}")]
    Traces(opentelemetry_otlp::ExporterBuildError),
    /// The metric exporter's configuration was refused.
    #[error("OTLP metric exporter: {0}")]
    Metrics(opentelemetry_otlp::ExporterBuildError),
}

impl OtlpSettings {
    /// The resource every exported span and metric carries, as the reference builds it
    /// (service name, namespace, instance id), over what the SDK's own detectors find
    /// (`OTEL_RESOURCE_ATTRIBUTES` among them).
    pub fn resource(&self) -> Resource {
        let instance = self.service_instance_id.clone().unwrap_or_else(random_uuid);
        let mut b = Resource::builder()
            .with_service_name(self.service_name.clone())
            .with_attribute(KeyValue::new("service.instance.id", instance));
        if !self.service_namespace.is_empty() {
            b = b.with_attribute(KeyValue::new(
                "service.namespace",
                self.service_namespace.clone(),
            ));
        }
        b.build()
    }

    /// Adds the OTLP metrics reader to `builder` when metrics are to go out over OTLP.
    /// Must run inside the Tokio runtime (the reader is a task on it).
    ///
    /// # Errors
    /// [`OtelError::Metrics`] when the exporter's configuration is refused.
    pub fn metrics_reader(
        &self,
        resource: &Resource,
        builder: MeterProviderBuilder,
    ) -> Result<MeterProviderBuilder, OtelError> {
        if !self.metrics {
            return Ok(builder);
        }
        let endpoint = self.endpoints.metrics(self.protocol);
        let exporter = opentelemetry_otlp::MetricExporter::builder();
        let exporter = match self.protocol {
            Protocol::Http => exporter
                .with_http()
                .with_protocol(Wire::HttpBinary)
                .with_endpoint(endpoint)
                .build(),
            Protocol::Grpc => exporter.with_tonic().with_endpoint(endpoint).build(),
        }
        .map_err(OtelError::Metrics)?;
        // The interval comes from OTEL_METRIC_EXPORT_INTERVAL (default 60 s).
        let reader = PeriodicReader::builder(exporter, Tokio).build();
        Ok(builder.with_resource(resource.clone()).with_reader(reader))
    }
}

/// A UUID v4 from the SDK's random ids, so no UUID crate is needed for one id at start.
fn random_uuid() -> String {
    let mut b = RandomIdGenerator::default().new_trace_id().to_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The tracer of ShouldRateLimit spans, and the pipeline that exports them.
#[derive(Debug)]
pub struct Tracer {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// `TRACING_SAMPLING_RATE` ≤ 0: a request without a sampled parent is never traced, so
    /// it skips the SDK altogether.
    roots_never: bool,
}

impl Tracer {
    /// Builds the pipeline: OTLP exporter, batch processor (`OTEL_BSP_*`), the reference's
    /// sampler (a sampled parent is followed; otherwise `TRACING_SAMPLING_RATE` of trace ids
    /// are kept). Must run inside the Tokio runtime.
    ///
    /// # Errors
    /// [`OtelError::Traces`] when the exporter's configuration is refused.
    pub fn new(settings: &OtlpSettings, resource: Resource) -> Result<Tracer, OtelError> {
        let endpoint = settings.endpoints.traces(settings.protocol);
        let exporter = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match settings.protocol {
            Protocol::Http => exporter
                .with_http()
                .with_protocol(Wire::HttpBinary)
                .with_endpoint(endpoint)
                .build(),
            Protocol::Grpc => exporter.with_tonic().with_endpoint(endpoint).build(),
        }
        .map_err(OtelError::Traces)?;
        let processor = BatchSpanProcessor::builder(exporter, Tokio).build();
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sampling_rate,
            ))))
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        let tracer = provider.tracer("sluice");
        Ok(Tracer {
            provider,
            tracer,
            roots_never: settings.sampling_rate <= 0.0,
        })
    }

    /// Starts the span of one ShouldRateLimit call over `via` whose request headers
    /// `header` looks up, or `None` when the call is not sampled (nothing more is spent on it).
    pub fn start<'h>(
        &self,
        via: Via,
        header: impl Fn(&str) -> Option<&'h str>,
        domain: &str,
        descriptors: usize,
    ) -> Option<RequestSpan> {
        let cx = match extract(&header) {
            Parent::NotSampled => return None,
            Parent::None if self.roots_never => return None,
            Parent::None => Context::new(),
            Parent::Sampled(sc) => {
                // The state is only parsed for a span that will carry it.
                let state = header("tracestate")
                    .filter(|_| sc.is_w3c)
                    .and_then(|s| TraceState::from_str(s).ok())
                    .unwrap_or_default();
                Context::new().with_remote_span_context(SpanContext::new(
                    sc.trace_id,
                    sc.span_id,
                    TraceFlags::SAMPLED,
                    true,
                    state,
                ))
            }
        };
        let mut span = self
            .tracer
            .span_builder(SPAN_NAME)
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &cx);
        if !span.is_recording() {
            return None;
        }
        match via {
            Via::Grpc => span.set_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
            ]),
            Via::Http => span.set_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("url.path", "/json"),
            ]),
        }
        span.set_attributes([
            KeyValue::new("domain", domain.to_string()),
            KeyValue::new("descriptors", descriptors as i64),
        ]);
        Some(RequestSpan { span, via })
    }

    /// Exports the spans still queued and stops the exporter. Blocks: call it off the
    /// runtime's workers (the batch task it waits for runs on them).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing the last spans failed");
        }
    }
}

/// How a ShouldRateLimit call came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The RLS gRPC service.
    Grpc,
    /// `POST /json`.
    Http,
}

/// A ShouldRateLimit span in progress.
#[derive(Debug)]
pub struct RequestSpan {
    span: opentelemetry_sdk::trace::Span,
    via: Via,
}

impl RequestSpan {
    /// Ends the span with the call's outcome: `status` is the gRPC code or HTTP status of the
    /// answer; `outcome` the overall code of a decision, or the reason of a refusal (an error
    /// status).
    pub fn end(mut self, status: i64, outcome: Result<&str, &str>) {
        let key = match self.via {
            Via::Grpc => "rpc.grpc.status_code",
            Via::Http => "http.response.status_code",
        };
        self.span.set_attribute(KeyValue::new(key, status));
        match outcome {
            Ok(code) => self
                .span
                .set_attribute(KeyValue::new("overall_code", code.to_string())),
            Err(message) => self.span.set_status(Status::error(message.to_string())),
        }
        self.span.end();
    }
}

/// A trace context read from request headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Remote {
    trace_id: TraceId,
    span_id: SpanId,
    /// From `traceparent`, so a `tracestate` goes with it.
    is_w3c: bool,
}

/// What the request headers say about the caller's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
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
fn extract<'h>(header: &impl Fn(&str) -> Option<&'h str>) -> Parent {
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

    #[test]
    fn endpoints_follow_the_otlp_specification() {
        let e = Endpoints {
            common: Some("http://collector:4318/".into()),
            traces: None,
            metrics: Some("http://m:9/custom".into()),
        };
        assert_eq!(e.traces(Protocol::Http), "http://collector:4318/v1/traces");
        assert_eq!(e.traces(Protocol::Grpc), "http://collector:4318/");
        assert_eq!(e.metrics(Protocol::Http), "http://m:9/custom");
        let none = Endpoints {
            common: None,
            traces: None,
            metrics: None,
        };
        assert_eq!(none.traces(Protocol::Grpc), "http://localhost:4317");
        assert_eq!(
            none.metrics(Protocol::Http),
            "http://localhost:4318/v1/metrics"
        );
    }

    #[test]
    fn instance_ids_are_uuids() {
        let u = random_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, random_uuid());
    }
}
