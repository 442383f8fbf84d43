//! OpenTelemetry over OTLP: a sluice process exports ShouldRateLimit spans (continuing W3C and
//! B3 contexts) and its metrics to a collector of this test's own, over gRPC and HTTP.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use parking_lot::Mutex;
use prost::Message as _;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Channel;

use crate::common;
use crate::common::{desc, free_port, http_async, wait_until_async};

const RULES: &str = "domain: otlp\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

/// One exported span, flattened: ids as hex, attributes as text, and its resource's.
#[derive(Debug, Clone)]
struct Exported {
    name: String,
    trace_id: String,
    parent_span_id: String,
    attrs: BTreeMap<String, String>,
    resource: BTreeMap<String, String>,
    error: Option<String>,
}

/// What the collector has received, over either protocol.
#[derive(Default)]
struct Received {
    spans: Mutex<Vec<Exported>>,
    /// Metric names, with their resource's `service.name`.
    metrics: Mutex<Vec<(String, String)>>,
}

impl Received {
    fn take_traces(&self, req: ExportTraceServiceRequest) {
        let mut out = self.spans.lock();
        for rs in req.resource_spans {
            let resource = attrs(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let error = s
                        .status
                        .filter(|st| st.code == StatusCode::Error as i32)
                        .map(|st| st.message);
                    out.push(Exported {
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        parent_span_id: hex(&s.parent_span_id),
                        attrs: attrs(&s.attributes),
                        resource: resource.clone(),
                        error,
                    });
                }
            }
        }
    }

    fn take_metrics(&self, req: ExportMetricsServiceRequest) {
        let mut out = self.metrics.lock();
        for rm in req.resource_metrics {
            let resource = attrs(&rm.resource.map(|r| r.attributes).unwrap_or_default());
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for sm in rm.scope_metrics {
                for m in sm.metrics {
                    out.push((m.name, service.clone()));
                }
            }
        }
    }

    fn span_of(&self, trace_id: &str) -> Option<Exported> {
        self.spans
            .lock()
            .iter()
            .find(|s| s.trace_id == trace_id)
            .cloned()
    }

    async fn wait_span(&self, trace_id: &str) -> Exported {
        wait_until_async(20, &format!("a span of trace {trace_id}"), || async {
            self.span_of(trace_id).is_some()
        })
        .await;
        self.span_of(trace_id).unwrap()
    }

    async fn wait_metric(&self, name: &str) -> String {
        let find = || {
            self.metrics
                .lock()
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, svc)| svc.clone())
        };
        wait_until_async(20, &format!("metric {name}"), || async { find().is_some() }).await;
        find().unwrap()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                Some(Any::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

#[derive(Clone)]
struct Grpc(Arc<Received>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.take_traces(req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.take_metrics(req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC collector on a free loopback port.
async fn grpc_collector() -> (SocketAddr, Arc<Received>) {
    let received = Arc::new(Received::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = Grpc(received.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(svc.clone()))
            .add_service(MetricsServiceServer::new(svc))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (addr, received)
}

/// An OTLP/HTTP collector (protobuf bodies on /v1/traces and /v1/metrics).
async fn http_collector() -> (SocketAddr, Arc<Received>) {
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::routing::post;
    let received = Arc::new(Received::default());
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            post(|State(r): State<Arc<Received>>, body: Bytes| async move {
                r.take_traces(ExportTraceServiceRequest::decode(body).unwrap());
                ExportTraceServiceResponse::default().encode_to_vec()
            }),
        )
        .route(
            "/v1/metrics",
            post(|State(r): State<Arc<Received>>, body: Bytes| async move {
                r.take_metrics(ExportMetricsServiceRequest::decode(body).unwrap());
                ExportMetricsServiceResponse::default().encode_to_vec()
            }),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, received)
}

/// A sluice process; killed when dropped.
struct Sluice {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    log: tempfile::NamedTempFile,
    _dir: tempfile::TempDir,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            eprintln!("sluice's log:\n{log}");
        }
    }
}

impl Sluice {
    /// Serves [`RULES`] with `env`, batching spans for 50 ms, and waits until it is ready.
    async fn start(env: &[(&str, &str)]) -> Sluice {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), RULES).unwrap();
        let (grpc, http) = (free_port(), free_port());
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.env_clear()
            .args(["serve", "--config"])
            .arg(dir.path())
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
            .env("SHUTDOWN_GRACE", "2s")
            .stdout(Stdio::null());
        let log = tempfile::NamedTempFile::new().unwrap();
        c.stderr(Stdio::from(log.reopen().unwrap()));
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c.spawn().unwrap();
        let http: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
        wait_until_async(20, "sluice ready", || async {
            matches!(http_async(http, "GET", "/readyz", "").await, Ok((200, ..)))
        })
        .await;
        Sluice {
            child,
            grpc: format!("127.0.0.1:{grpc}").parse().unwrap(),
            http,
            log,
            _dir: dir,
        }
    }

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// SIGTERM, then the exit status once it has exited.
    async fn terminate(mut self) -> std::process::ExitStatus {
        let kill = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let mut status = None;
        wait_until_async(20, "sluice to exit", || {
            status = self.child.try_wait().unwrap();
            std::future::ready(status.is_some())
        })
        .await;
        status.unwrap()
    }
}

/// A ShouldRateLimit of domain `otlp` with `n` descriptors and these metadata entries.
fn request(n: usize, meta: &[(&'static str, &str)]) -> tonic::Request<RateLimitRequest> {
    let mut r = tonic::Request::new(RateLimitRequest {
        domain: "otlp".into(),
        descriptors: (0..n).map(|_| desc(&[("k", "v")])).collect(),
        hits_addend: 0,
    });
    for (k, v) in meta {
        r.metadata_mut().insert(*k, v.parse().unwrap());
    }
    r
}

/// A call of one descriptor that continues `trace` (W3C `traceparent`), sampled.
fn sampled(trace: &str) -> tonic::Request<RateLimitRequest> {
    request(1, &[("traceparent", &format!("00-{trace}-{PARENT}-01"))])
}

const T1: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const T2: &str = "80f198ee56343ba864fe8b2a57d3eff7";
const T3: &str = "463ac35c9f6413ad48485a3953bb6124";
const T4: &str = "0af7651916cd43dd8448eb211c80319c";
const UNSAMPLED: &str = "11111111111111111111111111111111";
const PARENT: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread")]
async fn grpc_spans_continue_w3c_and_b3_contexts_and_metrics_follow_the_metrics_endpoint() {
    let (collector, received) = grpc_collector().await;
    let endpoint = format!("http://{collector}");
    let s = Sluice::start(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SERVICE_NAME", "rl-under-test"),
        ("TRACING_SERVICE_NAMESPACE", "edge"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-7"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        // Naming a metrics endpoint turns OTLP metrics on.
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &endpoint),
    ])
    .await;
    let mut c = s.client().await;

    // Not sampled by the caller: no span.
    let unsampled = format!("00-{UNSAMPLED}-{PARENT}-00");
    c.should_rate_limit(request(1, &[("traceparent", &unsampled)]))
        .await
        .unwrap();
    // W3C, two descriptors (the same entity: over its limit of 1).
    let tp = format!("00-{T1}-{PARENT}-01");
    let r = c
        .should_rate_limit(request(2, &[("traceparent", &tp), ("tracestate", "k=v")]))
        .await
        .unwrap();
    assert_eq!(r.get_ref().overall_code, 2, "OVER_LIMIT");
    // B3, multi-header and single-header.
    c.should_rate_limit(request(
        1,
        &[
            ("x-b3-traceid", T2),
            ("x-b3-spanid", PARENT),
            ("x-b3-sampled", "1"),
        ],
    ))
    .await
    .unwrap();
    let b3 = format!("{T3}-{PARENT}-1");
    c.should_rate_limit(request(1, &[("b3", &b3)]))
        .await
        .unwrap();
    // A refused request: the span is an error.
    let bad = format!("00-{T4}-{PARENT}-01");
    let err = c
        .should_rate_limit(request(0, &[("traceparent", &bad)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let w3c = received.wait_span(T1).await;
    assert_eq!(w3c.name, "ShouldRateLimit");
    assert_eq!(w3c.parent_span_id, PARENT);
    assert_eq!(w3c.attrs["domain"], "otlp");
    assert_eq!(w3c.attrs["descriptors"], "2");
    assert_eq!(w3c.attrs["overall_code"], "OVER_LIMIT");
    assert_eq!(w3c.error, None);
    assert_eq!(w3c.resource["service.name"], "rl-under-test");
    assert_eq!(w3c.resource["service.namespace"], "edge");
    assert_eq!(w3c.resource["service.instance.id"], "pod-7");
    for trace in [T2, T3] {
        let b3 = received.wait_span(trace).await;
        assert_eq!(b3.parent_span_id, PARENT, "{b3:?}");
        assert_eq!(b3.attrs["descriptors"], "1");
        assert_eq!(b3.attrs["overall_code"], "OVER_LIMIT", "{b3:?}");
    }
    let refused = received.wait_span(T4).await;
    assert_eq!(refused.attrs["descriptors"], "0");
    assert_eq!(refused.attrs["rpc.grpc.status_code"], "3");
    assert!(refused.error.is_some_and(|m| !m.is_empty()));
    // Spans are exported in the order they ended: the unsampled call's would be there by now.
    assert!(received.span_of(UNSAMPLED).is_none());
    assert_eq!(received.spans.lock().len(), 4);

    let service = received.wait_metric("sluice_requests_total").await;
    assert_eq!(service, "rl-under-test");
    received.wait_metric("ratelimit_over_limit_total").await;
    assert!(s.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn http_protocol_exports_spans_and_metrics_with_the_default_service_name() {
    let (collector, received) = http_collector().await;
    let endpoint = format!("http://{collector}");
    let s = Sluice::start(&[
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_METRICS_EXPORTER", "otlp"),
    ])
    .await;
    let mut c = s.client().await;
    c.should_rate_limit(sampled(T1)).await.unwrap();
    let span = received.wait_span(T1).await;
    assert_eq!(span.parent_span_id, PARENT);
    assert_eq!(span.attrs["overall_code"], "OK");
    assert_eq!(span.resource["service.name"], "RateLimit");
    // A random UUID when TRACING_SERVICE_INSTANCE_ID is unset.
    assert_eq!(span.resource["service.instance.id"].len(), 36);
    // A call without trace context is a root span at the default rate of 1.
    c.should_rate_limit(request(1, &[])).await.unwrap();
    wait_until_async(20, "the root span", || async {
        received
            .spans
            .lock()
            .iter()
            .any(|s| s.trace_id != T1 && s.parent_span_id.is_empty())
    })
    .await;
    // POST /json is traced too, from its HTTP headers (B3 here).
    let (addr, b3) = (s.http, format!("{T2}-{PARENT}-1"));
    let body = r#"{"domain":"otlp","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, ..) = tokio::task::spawn_blocking(move || {
        common::http(addr, "POST", "/json", body, &[("b3", &b3)]).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(status, 429);
    let json = received.wait_span(T2).await;
    assert_eq!(json.parent_span_id, PARENT);
    assert_eq!(json.attrs["url.path"], "/json");
    assert_eq!(json.attrs["http.response.status_code"], "429");
    assert_eq!(json.attrs["overall_code"], "OVER_LIMIT");
    assert_eq!(
        received.wait_metric("sluice_requests_total").await,
        "RateLimit"
    );
    assert!(s.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_rate_zero_traces_no_root_call_but_follows_a_sampled_parent() {
    let (collector, received) = grpc_collector().await;
    let endpoint = format!("http://{collector}");
    let s = Sluice::start(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SAMPLING_RATE", "0"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
    ])
    .await;
    let mut c = s.client().await;
    for _ in 0..20 {
        c.should_rate_limit(request(1, &[])).await.unwrap();
    }
    let unsampled = format!("{UNSAMPLED}-{PARENT}-0");
    c.should_rate_limit(request(1, &[("b3", &unsampled)]))
        .await
        .unwrap();
    // The reference's ParentBased sampler: what Envoy sampled is traced whatever the rate.
    // Exported after every call above, it shows that none of them was.
    c.should_rate_limit(sampled(T1)).await.unwrap();
    received.wait_span(T1).await;
    let spans = received.spans.lock().clone();
    assert_eq!(spans.len(), 1, "{spans:?}");
    // No metrics over OTLP unless asked for.
    assert!(received.metrics.lock().is_empty());
    assert!(s.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_still_batched_are_sent_on_sigterm() {
    let (collector, received) = grpc_collector().await;
    let endpoint = format!("http://{collector}");
    let s = Sluice::start(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        // Far longer than the test: only the shutdown flush can send the span.
        ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
    ])
    .await;
    let mut c = s.client().await;
    c.should_rate_limit(sampled(T1)).await.unwrap();
    drop(c);
    assert!(received.spans.lock().is_empty());
    assert!(s.terminate().await.success());
    assert!(received.span_of(T1).is_some(), "the span was not flushed");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_neither_fails_calls_nor_holds_up_the_stop() {
    // A port nothing listens on, over both protocols, with metrics too.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    for protocol in ["grpc", "http"] {
        let s = Sluice::start(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_METRICS_EXPORTER", "otlp"),
        ])
        .await;
        let mut c = s.client().await;
        for _ in 0..5 {
            c.should_rate_limit(sampled(T1)).await.unwrap();
        }
        drop(c);
        assert!(s.terminate().await.success(), "{protocol}");
    }
}

#[test]
fn a_refused_start_stops_the_exporters_even_on_a_single_threaded_runtime() {
    // The pipelines exist before the rules are read. Left to their drop, the exporters would
    // block the only thread on their own export task: the failed start must stop them. The
    // runtime runs on a thread of its own, so a regression fails here instead of hanging.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(async {
            let (collector, _received) = grpc_collector().await;
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("rules.yaml"), "domain: [not, a, domain]\n").unwrap();
            let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let mut settings =
                sluice::settings::Settings::for_addrs(dir.path().into(), loopback, loopback);
            settings.otlp.tracing = true;
            settings.otlp.metrics = true;
            settings.otlp.protocol = sluice::telemetry::otel::Protocol::Grpc;
            settings.otlp.endpoints.common = Some(format!("http://{collector}"));
            let listeners = sluice::Listeners::bind(&settings).await.unwrap();
            let clock = Arc::new(sluice::core::clock::ManualClock::new(common::T0));
            sluice::run(settings, listeners, clock, std::future::pending()).await
        });
        let _ = done.send(matches!(result, Err(sluice::RunError::Rules(_))));
    });
    let refused = finished
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the failed start hung");
    assert!(refused, "the rules were not what was refused");
}
