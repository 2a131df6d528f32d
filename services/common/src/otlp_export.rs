//! The OTLP span exporter, configured the way every OpenTelemetry SDK is: from the
//! `OTEL_EXPORTER_OTLP_*` variables, the traces-only form (`OTEL_EXPORTER_OTLP_TRACES_*`)
//! over the general one.
//!
//! - `OTEL_TRACES_EXPORTER`: `otlp` (the default) or `none`.
//! - `_ENDPOINT`: spans are exported only when one is set (a service with no collector
//!   makes no connection attempts). For `http/protobuf` the general endpoint gets
//!   `/v1/traces` appended and the traces one is used as it is, as the specification says.
//! - `_PROTOCOL`: `grpc` (Forkyard's default, which the manifests' collectors on :4317
//!   expect; the specification's default is `http/protobuf`, which must be named here) or
//!   `http/protobuf`. `http/json` is refused with one warning.
//! - `_HEADERS` (`key=value,…`, values URL-encoded): read by `opentelemetry-otlp` for both
//!   protocols, on every export request.
//! - `_CERTIFICATE` (a PEM CA bundle for the collector's certificate),
//!   `_CLIENT_CERTIFICATE` and `_CLIENT_KEY` (PEM, for mTLS): an `https://` endpoint is
//!   verified against the system's roots plus that CA.
//! - `_TIMEOUT` (milliseconds): each export's bound; 3 s when unset, so a collector that
//!   swallows connections costs the exporter's own thread a short wait per batch, never a
//!   request's time.

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use std::time::Duration;

/// When no `_TIMEOUT` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// What the environment asks of the exporter, checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub protocol: Protocol,
    /// Where spans go: for HTTP, the whole URL of the traces path.
    pub endpoint: String,
    pub timeout: Duration,
    /// PEM: a CA the collector's certificate is also checked against.
    pub ca: Option<Vec<u8>>,
    /// PEM certificate and key this service presents (mTLS).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The traces-specific variable, else the general one; empty counts as unset.
fn var(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<(String, String)> {
    let traces = name.replacen("OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_", 1);
    [traces, name.to_owned()].into_iter().find_map(|n| {
        let v = get(&n)?;
        let v = v.trim();
        (!v.is_empty()).then(|| (n, v.to_owned()))
    })
}

/// The exporter's settings from `get` (the environment), `Ok(None)` when nothing is to be
/// exported; an error names the variable and what is wrong with it.
pub(crate) fn settings(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Settings>, String> {
    match get("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None | Some("" | "otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other}: only otlp and none are supported"
            ));
        }
    }
    let protocol = match var(get, "OTEL_EXPORTER_OTLP_PROTOCOL") {
        None => Protocol::Grpc,
        Some((_, p)) if p == "grpc" => Protocol::Grpc,
        Some((_, p)) if p == "http/protobuf" => Protocol::HttpProtobuf,
        Some((n, p)) => return Err(format!("{n}={p}: use grpc or http/protobuf")),
    };
    let Some(endpoint) = endpoint(get, protocol)? else {
        return Ok(None);
    };
    let timeout = match var(get, "OTEL_EXPORTER_OTLP_TIMEOUT") {
        None => DEFAULT_TIMEOUT,
        Some((n, ms)) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("{n}={ms}: not a number of milliseconds"))?,
        ),
    };
    let file = |name: &str| -> Result<Option<Vec<u8>>, String> {
        var(get, name)
            .map(|(n, path)| std::fs::read(&path).map_err(|e| format!("{n}={path}: {e}")))
            .transpose()
    };
    let ca = file("OTEL_EXPORTER_OTLP_CERTIFICATE")?;
    let identity = match (
        file("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")?,
        file("OTEL_EXPORTER_OTLP_CLIENT_KEY")?,
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY go together".into());
        }
    };
    Ok(Some(Settings {
        protocol,
        endpoint,
        timeout,
        ca,
        identity,
    }))
}

/// The collector's URL: `http` or `https` with a host; for HTTP from the general variable,
/// with the traces path appended.
fn endpoint(
    get: &dyn Fn(&str) -> Option<String>,
    protocol: Protocol,
) -> Result<Option<String>, String> {
    let (name, endpoint) = match var(get, "OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some(found) => found,
        None => return Ok(None),
    };
    let url = url::Url::parse(&endpoint).map_err(|e| format!("{name}={endpoint}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{name}={endpoint}: needs http(s)://host:port"));
    }
    let general = name == "OTEL_EXPORTER_OTLP_ENDPOINT";
    Ok(Some(match protocol {
        Protocol::HttpProtobuf if general => {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        }
        _ => endpoint,
    }))
}

/// The exporter the settings describe.
pub(crate) fn build(s: &Settings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
    let built = match s.protocol {
        Protocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(&s.endpoint)
                .with_timeout(s.timeout);
            if s.endpoint.starts_with("https://") {
                b = b.with_tls_config(grpc_tls(s));
            }
            b.build()
        }
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(&s.endpoint)
            .with_timeout(s.timeout)
            .with_http_client(OnTokio::new(s)?)
            .build(),
    };
    built.map_err(|e| e.to_string())
}

fn grpc_tls(s: &Settings) -> tonic::transport::ClientTlsConfig {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new().with_native_roots();
    if let Some(ca) = &s.ca {
        tls = tls.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = &s.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    tls
}

/// The OTLP/HTTP client: the workspace's async reqwest, each request run on the runtime
/// the service started the exporter on. The batch processor exports from a thread of its
/// own with no Tokio reactor, where reqwest cannot run, and its blocking client would
/// bring a second runtime and a second build of reqwest.
#[derive(Debug)]
struct OnTokio {
    client: reqwest::Client,
    rt: tokio::runtime::Handle,
}

impl OnTokio {
    fn new(s: &Settings) -> Result<Self, String> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| "http/protobuf export needs the service's runtime".to_owned())?;
        let mut b = reqwest::Client::builder().timeout(s.timeout);
        if let Some(ca) = &s.ca {
            for cert in reqwest::Certificate::from_pem_bundle(ca)
                .map_err(|e| format!("OTEL_EXPORTER_OTLP_CERTIFICATE: {e}"))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &s.identity {
            let pem = [cert.as_slice(), b"\n", key.as_slice()].concat();
            b = b.identity(
                reqwest::Identity::from_pem(&pem)
                    .map_err(|e| format!("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE/_KEY: {e}"))?,
            );
        }
        let client = b.build().map_err(|e| e.to_string())?;
        Ok(Self { client, rt })
    }
}

#[tonic::async_trait]
impl HttpClient for OnTokio {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let sent = self.rt.spawn(async move {
            let resp = client.execute(request).await?;
            let mut out = Response::builder().status(resp.status().as_u16());
            for (k, v) in resp.headers() {
                out = out.header(k, v);
            }
            let body = resp.bytes().await?;
            Ok::<_, HttpError>(out.body(body)?)
        });
        sent.await?
    }
}

#[cfg(test)]
#[path = "otlp_export_tests.rs"]
mod tests;
