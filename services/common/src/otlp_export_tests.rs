use super::{Protocol, settings};
use std::collections::HashMap;

fn with(vars: &[(&str, &str)]) -> Result<Option<super::Settings>, String> {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    settings(&|k| env.get(k).cloned())
}

#[test]
fn nothing_is_exported_without_an_endpoint_or_with_the_exporter_off() {
    assert_eq!(with(&[]), Ok(None));
    assert_eq!(with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")]), Ok(None));
    assert_eq!(
        with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_EXPORTER", "none")
        ]),
        Ok(None)
    );
}

#[test]
fn grpc_is_the_default_and_its_endpoint_is_used_as_given() {
    let s = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")])
        .unwrap()
        .unwrap();
    assert_eq!(s.protocol, Protocol::Grpc);
    assert_eq!(s.endpoint, "http://collector:4317");
    assert_eq!(s.timeout, super::DEFAULT_TIMEOUT);
}

#[test]
fn http_appends_the_traces_path_to_the_general_endpoint_only() {
    let general = with(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318/"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(general.protocol, Protocol::HttpProtobuf);
    assert_eq!(general.endpoint, "https://collector:4318/v1/traces");
    let traces = with(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/custom/path",
        ),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1500"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(traces.protocol, Protocol::HttpProtobuf);
    assert_eq!(traces.endpoint, "http://c:4318/custom/path");
    assert_eq!(traces.timeout, std::time::Duration::from_millis(1500));
}

#[test]
fn each_bad_setting_is_named() {
    let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
    let err = |vars: &[(&str, &str)]| with(vars).unwrap_err();
    assert!(
        err(&[ep, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
            .contains("OTEL_EXPORTER_OTLP_PROTOCOL=http/json")
    );
    assert!(err(&[ep, ("OTEL_TRACES_EXPORTER", "zipkin")]).contains("OTEL_TRACES_EXPORTER"));
    assert!(
        err(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")])
            .contains("OTEL_EXPORTER_OTLP_ENDPOINT")
    );
    assert!(
        err(&[ep, ("OTEL_EXPORTER_OTLP_TIMEOUT", "3s")]).contains("OTEL_EXPORTER_OTLP_TIMEOUT=3s")
    );
    assert!(
        err(&[
            ep,
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")
        ])
        .contains("OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem")
    );
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("c.pem");
    std::fs::write(&cert, "x").unwrap();
    assert!(
        err(&[
            ep,
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                cert.to_str().unwrap()
            )
        ])
        .contains("_CLIENT_KEY")
    );
}
