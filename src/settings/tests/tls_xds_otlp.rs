//! Tests of the gRPC port's TLS, the xDS client's and the OTLP exporters' settings.

use super::*;

#[test]
fn grpc_tls_is_off_by_default_and_needs_its_files() {
    assert_eq!(resolve(&[], &[]).unwrap().grpc_tls, None);
    let errs = resolve(&["--grpc-server-use-tls"], &[]).unwrap_err();
    assert_eq!(
        names(&errs),
        ["GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"]
    );
    assert_eq!(
        errs[0].to_string(),
        "GRPC_SERVER_TLS_CERT (--grpc-server-tls-cert): is required when GRPC_SERVER_USE_TLS is true"
    );
}

#[test]
fn grpc_tls_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let junk = dir.path().join("junk.key");
    std::fs::write(&junk, "not a key\n").unwrap();
    let (missing_s, junk_s) = (missing.to_str().unwrap(), junk.to_str().unwrap());
    let env = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", missing_s),
        ("GRPC_SERVER_TLS_KEY", junk_s),
        ("GRPC_CLIENT_TLS_CACERT", junk_s),
    ];
    let errs = resolve(&[], &env).unwrap_err();
    assert_eq!(
        names(&errs),
        ["GRPC_SERVER_TLS_CERT", "GRPC_CLIENT_TLS_CACERT"]
    );
    assert!(errs[0].message.starts_with(missing_s), "{}", errs[0]);
    assert!(errs[1].message.starts_with(junk_s), "{}", errs[1]);
    assert!(
        errs[1].message.contains("no PEM certificate"),
        "{}",
        errs[1]
    );
}

#[test]
fn client_verification_needs_tls_and_the_san_needs_a_ca() {
    let errs = resolve(&["--grpc-client-tls-cacert", "/ca.pem"], &[]).unwrap_err();
    assert_eq!(names(&errs), ["GRPC_SERVER_USE_TLS"]);
    let errs = resolve(
        &[
            "--grpc-server-use-tls",
            "--grpc-client-tls-san",
            "not a name!",
        ],
        &[("GRPC_SERVER_TLS_CERT", ""), ("GRPC_SERVER_TLS_KEY", "")],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        [
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_SAN",
            "GRPC_CLIENT_TLS_SAN"
        ]
    );
    assert!(errs[2].message.contains("needs GRPC_CLIENT_TLS_CACERT"));
    assert!(errs[3].message.contains("not a DNS name or IP address"));
}

#[test]
fn xds_takes_the_references_variables() {
    let s = resolve(&[], &[]).unwrap();
    assert!(s.xds.is_none(), "CONFIG_TYPE defaults to FILE");
    let s = resolve(&[], &[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap();
    let x = s.xds.unwrap();
    assert_eq!(
        (x.server_url.as_str(), x.node_id.as_str()),
        ("localhost:18000", "default")
    );
    assert_eq!(
        (x.retry_interval, x.retry_max),
        (Duration::from_secs(3), Duration::from_secs(60))
    );
    assert!(x.tls.is_none() && x.headers.is_empty() && x.node_metadata.is_empty());
    assert!(!x.force_start && !x.need_a_domain && x.max_message_bytes.is_none());

    let s = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "grpc_xds_sotw"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds.internal:18000"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,key1:val1,team=b=c"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "Authorization:Bearer t,x-a:1",
            ),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
        ],
    )
    .unwrap();
    let x = s.xds.unwrap();
    let pairs = |v: &[(String, String)]| {
        v.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&x.node_metadata), ["zone=a", "team=b=c"]);
    assert_eq!(pairs(&x.headers), ["authorization=Bearer t", "x-a=1"]);
    assert_eq!(x.max_message_bytes, Some(1_048_576));
    assert_eq!(
        s.warnings,
        ["CONFIG_GRPC_XDS_NODE_METADATA: 'key1:val1' is not key=value and is not sent"]
    );
    assert!(
        !format!("{x:?}").contains("Bearer"),
        "header values stay out of Debug"
    );
}

#[test]
fn bad_xds_settings_are_reported() {
    let errs = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0s"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "token-only"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        [
            "CONFIG_TYPE",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        ]
    );
    assert_eq!(
        errs[1].message,
        "'<redacted>' holds an entry that is not name:value"
    );
    let errs = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "http://x:1"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/nonexistent.crt"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        [
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_SERVER_URL"
        ]
    );
    let errs = resolve(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent-ca.crt"),
        ],
    )
    .unwrap_err();
    assert_eq!(names(&errs), ["CONFIG_GRPC_XDS_SERVER_TLS_CACERT"]);
    assert!(errs[0].message.contains("/nonexistent-ca.crt"), "{errs:?}");
    // With files, the TLS files are not read.
    resolve(
        &[],
        &[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent-ca.crt"),
        ],
    )
    .unwrap();
}

#[test]
fn otlp_settings_have_the_references_defaults_and_meanings() {
    use crate::telemetry::otel::Protocol;
    let s = resolve(&[], &[]).unwrap().otlp;
    assert!(!s.tracing && !s.metrics);
    assert_eq!(s.protocol, Protocol::Http);
    assert_eq!(s.service_name, "RateLimit");
    assert_eq!(
        (s.service_namespace.as_str(), s.service_instance_id),
        ("", None)
    );
    assert_eq!(s.sampling_rate, 1.0);
    assert_eq!(
        s.endpoints.traces(s.protocol),
        "http://localhost:4318/v1/traces"
    );

    let s = resolve(
        &["--tracing-sampling-rate", "0.5"],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "GRPC"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
        ],
    )
    .unwrap()
    .otlp;
    assert!(
        s.tracing && !s.metrics,
        "the common endpoint alone sends no metrics"
    );
    assert_eq!(s.protocol, Protocol::Grpc);
    assert_eq!(s.sampling_rate, 0.5);
    assert_eq!(s.service_instance_id.as_deref(), Some("pod-1"));
    assert_eq!(s.endpoints.traces(s.protocol), "http://collector:4317");

    // As the reference: any number, past 1 always, under 0 never.
    let rate = |r| {
        resolve(&[], &[("TRACING_SAMPLING_RATE", r)])
            .unwrap()
            .otlp
            .sampling_rate
    };
    assert_eq!((rate("7"), rate("-1")), (1.0, 0.0));
    // OTLP metrics: asked for by name, or by naming their endpoint.
    let metrics = |env: &[(&str, &str)]| resolve(&[], env).unwrap().otlp.metrics;
    assert!(metrics(&[("OTEL_METRICS_EXPORTER", "prometheus, otlp")]));
    assert!(metrics(&[(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "http://m:4318/v1/metrics"
    )]));
    assert!(!metrics(&[("OTEL_METRICS_EXPORTER", "none")]));
}

#[test]
fn bad_otlp_settings_are_refused_by_name() {
    let errs = resolve(
        &[],
        &[
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
            ("TRACING_SAMPLING_RATE", "often"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318"),
            ("OTEL_METRICS_EXPORTER", "console"),
        ],
    )
    .unwrap_err();
    assert_eq!(
        names(&errs),
        vec![
            "TRACING_EXPORTER_PROTOCOL",
            "TRACING_SAMPLING_RATE",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_METRICS_EXPORTER",
        ]
    );
    assert!(errs[2].message.contains("TLS"), "{}", errs[2]);
}
