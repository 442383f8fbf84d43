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
    Span as _, SpanContext, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceState,
    Tracer as _, TracerProvider as _,
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

use super::trace_context::{extract, Parent};

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

#[cfg(test)]
mod tests {
    use super::*;

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
