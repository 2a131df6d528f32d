//! TLS and mTLS to Temporal. `temporal server start-dev` has no TLS options, so the test
//! puts a TLS terminator in front of it (rustls, demanding a client certificate from the
//! mesh CA, as Temporal Cloud does) and points a gateway at it with TEMPORAL_TLS_CERT /
//! TEMPORAL_TLS_KEY / TEMPORAL_TLS_CA. The gateway only serves once it has connected to
//! Temporal and registered its search attributes there, so SERVING proves the whole
//! client path ran over mTLS; without a client certificate it never connects.

use forkyard_tests::mesh::{bin_dir, temporal_cli};
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, RootCertStore,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
        server::WebPkiClientVerifier,
    },
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A TLS terminator on a free port in front of `upstream`, requiring a client certificate
/// signed by `certs/ca.pem`; returns its port and the count of completed handshakes.
async fn tls_terminator(certs: &Path, upstream: u16) -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.join("ca.pem"))? {
        roots.add(c?)?;
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
    let chain = CertificateDer::pem_file_iter(certs.join("temporal.pem"))?
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(certs.join("temporal.key"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                }
            });
        }
    });
    Ok((port, handshakes))
}

/// A TLS front on a free port (no client certificate asked) that lets through to
/// `upstream` only the gRPC calls carrying `authorization: Bearer {key}`, answering the
/// others UNAUTHENTICATED; its port and the count of calls refused.
async fn api_key_front(
    certs: &Path,
    upstream: u16,
    key: &'static str,
) -> anyhow::Result<(u16, Arc<AtomicUsize>)> {
    let chain = CertificateDer::pem_file_iter(certs.join("temporal.pem"))?
        .collect::<Result<Vec<_>, _>>()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(
        chain,
        PrivateKeyDer::from_pem_file(certs.join("temporal.key"))?,
    )?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let refused = Arc::new(AtomicUsize::new(0));
    let counted = refused.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(sock).await {
                    let _ = serve_checked(tls, upstream, key, counted).await;
                }
            });
        }
    });
    Ok((port, refused))
}

/// One client connection: each call checked, then sent on over a connection of its own
/// to the dev server (bodies and trailers streamed through).
async fn serve_checked(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    upstream: u16,
    key: &'static str,
    refused: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let up = TcpStream::connect(("127.0.0.1", upstream)).await?;
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(up)).await?;
    tokio::spawn(conn);
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (mut sender, refused) = (sender.clone(), refused.clone());
        async move {
            let authorized = req
                .headers()
                .get("authorization")
                .is_some_and(|v| v.as_bytes() == format!("Bearer {key}").as_bytes());
            if !authorized {
                refused.fetch_add(1, Ordering::SeqCst);
                return Ok::<_, hyper::Error>(unauthenticated());
            }
            let (mut parts, body) = req.into_parts();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            parts.uri = format!("http://127.0.0.1:{upstream}{path}")
                .parse()
                .unwrap();
            let resp = sender
                .send_request(hyper::Request::from_parts(parts, body))
                .await?;
            Ok(resp.map(http_body_util::BodyExt::boxed))
        }
    });
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await?;
    Ok(())
}

type Boxed = http_body_util::combinators::BoxBody<bytes::Bytes, hyper::Error>;

/// A trailers-only gRPC answer: UNAUTHENTICATED, as Temporal Cloud gives a call without
/// its key.
fn unauthenticated() -> hyper::Response<Boxed> {
    use http_body_util::BodyExt as _;
    hyper::Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "16")
        .header("grpc-message", "missing%20or%20wrong%20API%20key")
        .body(
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap()
}

/// A Temporal dev server on a free port, its database in `state`; (process, port).
fn temporal_dev(state: &Path) -> anyhow::Result<(Killed, u16)> {
    let port = free_port();
    let child = Command::new(temporal_cli())
        .args(["server", "start-dev", "--headless", "--log-level", "warn"])
        .args(["--ip", "127.0.0.1", "--port", &port.to_string()])
        .args(["--ui-port", &free_port().to_string()])
        .arg("--db-filename")
        .arg(state.join("temporal.db"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok((Killed(child), port))
}

fn make_certs(dir: &Path) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/certs.sh");
    let out = Command::new("bash").arg(script).arg(dir).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Start a gateway against Temporal at `temporal` with `tls_env`; (process, gRPC port).
fn gateway(
    state: &Path,
    temporal: &str,
    tls_env: &[(&str, PathBuf)],
) -> anyhow::Result<(Killed, u16)> {
    let port = free_port();
    let log = std::fs::File::create(state.join(format!("gateway-{port}.log")))?;
    let child = Command::new(bin_dir().join("gateway"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("TEMPORAL_ADDRESS", temporal)
        .env("FORKYARD_TEMPORAL_CONNECT_TIMEOUT_SECS", "5")
        .env("FORKYARD_STATE_DIR", state)
        .env("FORKYARD_AUTH", "none")
        .env("FORKYARD_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "FORKYARD_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .envs(tls_env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    Ok((Killed(child), port))
}

/// Wait until the gateway serves (true) or exits (false).
async fn serves(gw: &mut Killed, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = gw.0.try_wait() {
            return false;
        }
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            && let Ok(r) = HealthClient::new(ch)
                .check(HealthCheckRequest::default())
                .await
            && r.into_inner().status == ServingStatus::Serving as i32
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[tokio::test]
async fn the_gateway_reaches_temporal_over_mtls_and_not_without_a_certificate() -> anyhow::Result<()>
{
    let state = tempfile::Builder::new()
        .prefix("forkyard-ttls-")
        .tempdir()?;
    let certs = state.path().join("certs");
    make_certs(&certs)?;
    let rogue = state.path().join("rogue");
    make_certs(&rogue)?;

    let (_temporal, temporal_port) = temporal_dev(state.path())?;
    let (tls_port, handshakes) = tls_terminator(&certs, temporal_port).await?;
    let address = format!("127.0.0.1:{tls_port}");

    // With the mesh's client certificate: connects, registers attributes, serves.
    let (mut ok, port) = gateway(
        state.path(),
        &address,
        &[
            ("TEMPORAL_TLS_CERT", certs.join("gateway.pem")),
            ("TEMPORAL_TLS_KEY", certs.join("gateway.key")),
            ("TEMPORAL_TLS_CA", certs.join("ca.pem")),
        ],
    )?;
    assert!(
        serves(&mut ok, port).await,
        "gateway did not serve over temporal mtls"
    );
    assert!(handshakes.load(Ordering::SeqCst) > 0);
    drop(ok);

    // TLS but no client certificate, and a certificate from another CA: refused.
    for (what, env) in [
        (
            "no client certificate",
            vec![("TEMPORAL_TLS_CA", certs.join("ca.pem"))],
        ),
        (
            "another CA's certificate",
            vec![
                ("TEMPORAL_TLS_CERT", rogue.join("gateway.pem")),
                ("TEMPORAL_TLS_KEY", rogue.join("gateway.key")),
                ("TEMPORAL_TLS_CA", certs.join("ca.pem")),
            ],
        ),
    ] {
        let before = handshakes.load(Ordering::SeqCst);
        let (mut refused, port) = gateway(state.path(), &address, &env)?;
        assert!(!serves(&mut refused, port).await, "served with {what}");
        assert_eq!(
            handshakes.load(Ordering::SeqCst),
            before,
            "{what} got through"
        );
    }

    // A certificate without its key is a configuration error naming the setting.
    let out = Command::new(bin_dir().join("gateway"))
        .env_clear()
        .env("FORKYARD_AUTH", "none")
        .env("TEMPORAL_TLS_CERT", certs.join("gateway.pem"))
        .env("FORKYARD_STATE_DIR", state.path())
        .output()?;
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TEMPORAL_TLS_KEY"), "{err}");
    Ok(())
}

#[tokio::test]
async fn the_gateway_reaches_temporal_with_an_api_key_over_tls_and_never_logs_it()
-> anyhow::Result<()> {
    const KEY: &str = "tmprl-test-api-key-7f3a";
    let state = tempfile::Builder::new()
        .prefix("forkyard-tkey-")
        .tempdir()?;
    let certs = state.path().join("certs");
    make_certs(&certs)?;
    let (_temporal, temporal_port) = temporal_dev(state.path())?;
    let (front, refused) = api_key_front(&certs, temporal_port, KEY).await?;
    let address = format!("127.0.0.1:{front}");
    // TEMPORAL_TLS_CA only because the front's certificate is the test CA's: the key
    // alone turns TLS on (Temporal Cloud's certificates are in the system roots).
    let ca = ("TEMPORAL_TLS_CA", certs.join("ca.pem"));

    // Without the key: refused, never serving.
    let (mut without, port) = gateway(state.path(), &address, std::slice::from_ref(&ca))?;
    assert!(!serves(&mut without, port).await, "served without the key");
    assert!(refused.load(Ordering::SeqCst) > 0);
    drop(without);

    // With it: every call authorized, the gateway serves; the key is in no log line.
    let before = refused.load(Ordering::SeqCst);
    let key_env = ("TEMPORAL_API_KEY", PathBuf::from(KEY));
    let (mut with, port) = gateway(state.path(), &address, &[ca, key_env])?;
    assert!(serves(&mut with, port).await, "did not serve with the key");
    assert_eq!(
        refused.load(Ordering::SeqCst),
        before,
        "a call without the key"
    );
    drop(with);
    for log in std::fs::read_dir(state.path())? {
        let log = log?.path();
        if log.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&log)?;
            assert!(!text.contains(KEY), "the key in {}", log.display());
        }
    }
    Ok(())
}
