//! A local server speaking E2B's wire protocol: the control-plane REST API
//! (`/sandboxes`, header `X-API-KEY`) and envd (Connect `process.Process/Start` with the
//! streaming envelope, `SendSignal`, `GET/POST /files`, `/health`), routed by the
//! `E2b-Sandbox-Id` header. Each fake sandbox is a temp dir whose `/home/user` is
//! `<root>/home/user`; commands really run there (absolute `/home/user…` arguments and
//! working directories are mapped into the root).
//!
//! For tests (`test-support`): the provisioner's own E2B tests and the end-to-end
//! tests that run forks on E2B through the whole mesh.

mod network;
mod seen;
mod session;

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::io::AsyncReadExt;

#[derive(Default)]
pub struct Fake {
    pub key: String,
    pub root: PathBuf,
    pub sandboxes: Mutex<HashMap<String, HashMap<String, String>>>,
    /// Every X-API-KEY value the control plane saw.
    pub keys_seen: Mutex<Vec<String>>,
    /// Answer the next N control-plane calls with this status.
    pub fail: Mutex<Option<(u16, usize)>>,
    /// Delay every control-plane answer by this much.
    pub delay: Mutex<Duration>,
    pub pids: Mutex<HashMap<u32, ()>>,
    /// Every timeout asked for: (sandbox, "create" | "set" | "resume", seconds).
    pub timeouts: Mutex<Vec<(String, &'static str, u64)>>,
    pub paused: Mutex<std::collections::HashSet<String>>,
    /// Pty masters of running pty commands, by pid.
    pub ptys: Mutex<HashMap<u32, std::fs::File>>,
    /// The template each sandbox was created from.
    pub templates: Mutex<HashMap<String, String>>,
    /// When each sandbox was created (RFC 3339, as E2B's `startedAt`): its cost per
    /// second of life is counted from it.
    pub started: Mutex<HashMap<String, String>>,
    /// The network rules each sandbox was created with (`NewSandbox.network`).
    pub networks: Mutex<HashMap<String, Value>>,
    /// Every process start: (sandbox, envd's `process` object: cmd, args, envs, cwd).
    pub commands: Mutex<Vec<(String, Value)>>,
    /// Every file written through envd: (sandbox, path, content).
    pub files_written: Mutex<Vec<(String, String, Vec<u8>)>>,
}

pub struct Server {
    pub url: String,
    pub fake: Arc<Fake>,
    _tmp: tempfile::TempDir,
}

pub async fn start(key: &str) -> Server {
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake {
        key: key.into(),
        root: tmp.path().to_owned(),
        ..Default::default()
    });
    let app = Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(session::pause))
        .route("/sandboxes/{id}/resume", post(session::resume))
        .route("/process.Process/Start", post(start_process))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/SendInput", post(session::send_input))
        .route("/process.Process/Update", post(session::update))
        .route("/files", get(read_file).post(write_file))
        // A repository's bundle is uploaded whole (envd takes large files).
        .layer(axum::extract::DefaultBodyLimit::max(1 << 30))
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        url,
        fake,
        _tmp: tmp,
    }
}

impl Fake {
    pub(crate) fn sandbox_root(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }
    pub(crate) fn map(&self, id: &str, p: &str) -> String {
        if p.starts_with("/home/user") {
            self.sandbox_root(id)
                .join(p.trim_start_matches('/'))
                .to_string_lossy()
                .into_owned()
        } else {
            p.to_owned()
        }
    }
}

/// Control-plane gate: key check, injected failures and delay.
pub(crate) async fn gate(f: &Fake, h: &HeaderMap) -> Result<(), Response> {
    let got = h
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    f.keys_seen.lock().unwrap().push(got.clone());
    let delay = *f.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    if got != f.key {
        return Err((
            StatusCode::UNAUTHORIZED,
            Json(json!({"code": 401, "message": "Invalid API key"})),
        )
            .into_response());
    }
    let mut fail = f.fail.lock().unwrap();
    if let Some((status, n)) = *fail {
        *fail = (n > 1).then(|| (status, n - 1));
        return Err((
            StatusCode::from_u16(status).unwrap(),
            Json(json!({"code": status, "message": "injected failure"})),
        )
            .into_response());
    }
    Ok(())
}

fn describe(f: &Fake, id: &str, md: &HashMap<String, String>) -> Value {
    let state = if f.paused.lock().unwrap().contains(id) {
        "paused"
    } else {
        "running"
    };
    let template = f
        .templates
        .lock()
        .unwrap()
        .get(id)
        .cloned()
        .unwrap_or_default();
    let started = f
        .started
        .lock()
        .unwrap()
        .get(id)
        .cloned()
        .unwrap_or_default();
    json!({"templateID": template, "sandboxID": id, "clientID": "fake", "alias": null,
           "startedAt": started, "endAt": started,
           "cpuCount": 2, "memoryMB": 512, "metadata": md, "state": state})
}

/// Now, as E2B writes its times.
fn now_rfc3339() -> String {
    let ms = crate::clock::now_ms();
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

async fn create(State(f): State<Arc<Fake>>, h: HeaderMap, Json(body): Json<Value>) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    let network = match network::check(&body) {
        Ok(n) => n,
        Err(message) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"code": 400, "message": message})),
            )
                .into_response();
        }
    };
    // Unique within the process (several fakes may run in one test binary).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("i{}x{n:06}", std::process::id());
    std::fs::create_dir_all(f.sandbox_root(&id).join("home/user")).unwrap();
    let md: HashMap<String, String> =
        serde_json::from_value(body["metadata"].clone()).unwrap_or_default();
    f.sandboxes.lock().unwrap().insert(id.clone(), md);
    f.started.lock().unwrap().insert(id.clone(), now_rfc3339());
    if let Some(n) = network {
        f.networks.lock().unwrap().insert(id.clone(), n);
    }
    if let Some(t) = body["templateID"].as_str() {
        f.templates.lock().unwrap().insert(id.clone(), t.to_owned());
    }
    if let Some(t) = body["timeout"].as_u64() {
        f.timeouts.lock().unwrap().push((id.clone(), "create", t));
    }
    (
        StatusCode::CREATED,
        Json(
            json!({"templateID": body["templateID"], "sandboxID": id, "clientID": "fake",
                    "envdVersion": "0.2.0", "alias": null, "domain": null}),
        ),
    )
        .into_response()
}

async fn list(
    State(f): State<Arc<Fake>>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    let want: Vec<(String, String)> = q
        .get("metadata")
        .map(|m| {
            m.split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let all: Vec<Value> = f
        .sandboxes
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, md)| want.iter().all(|(k, v)| md.get(k) == Some(v)))
        .map(|(id, md)| describe(&f, id, md))
        .collect();
    Json(all).into_response()
}

async fn get_one(State(f): State<Arc<Fake>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    match f.sandboxes.lock().unwrap().get(&id) {
        Some(md) => Json(describe(&f, &id, md)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"code": 404, "message": "not found"})),
        )
            .into_response(),
    }
}

async fn kill(State(f): State<Arc<Fake>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    if f.sandboxes.lock().unwrap().remove(&id).is_some() {
        let _ = std::fs::remove_dir_all(f.sandbox_root(&id));
        StatusCode::NO_CONTENT.into_response()
    } else {
        (
            StatusCode::NOT_FOUND,
            Json(json!({"code": 404, "message": "not found"})),
        )
            .into_response()
    }
}

async fn set_timeout(
    State(f): State<Arc<Fake>>,
    h: HeaderMap,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    if !f.sandboxes.lock().unwrap().contains_key(&id) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let t = body["timeout"].as_u64().expect("timeout in seconds");
    f.timeouts.lock().unwrap().push((id, "set", t));
    StatusCode::NO_CONTENT.into_response()
}

#[allow(clippy::result_large_err)]
pub(crate) fn sandbox_of(f: &Fake, h: &HeaderMap) -> Result<String, Response> {
    let id = h
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if h.get("e2b-sandbox-port").and_then(|v| v.to_str().ok()) != Some("49983") {
        return Err(StatusCode::BAD_GATEWAY.into_response());
    }
    if f.sandboxes.lock().unwrap().contains_key(&id) {
        Ok(id)
    } else {
        Err(StatusCode::NOT_FOUND.into_response())
    }
}

pub(crate) fn envelope(flags: u8, v: &Value) -> Bytes {
    let msg = serde_json::to_vec(v).unwrap();
    let mut b = vec![flags];
    b.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    b.extend_from_slice(&msg);
    Bytes::from(b)
}

async fn start_process(State(f): State<Arc<Fake>>, h: HeaderMap, body: Bytes) -> Response {
    let id = match sandbox_of(&f, &h) {
        Ok(id) => id,
        Err(r) => return r,
    };
    assert_eq!(
        h.get("content-type").unwrap(),
        "application/connect+json",
        "server streaming uses the connect envelope"
    );
    assert!(body.len() >= 5 && body[0] == 0);
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let req: Value = serde_json::from_slice(&body[5..5 + len]).unwrap();
    if req.get("pty").is_some() {
        return session::start_pty(&f, &id, &req);
    }
    let p = &req["process"];
    f.commands.lock().unwrap().push((id.clone(), p.clone()));
    let cmd = p["cmd"].as_str().unwrap().to_owned();
    let args: Vec<String> = p["args"]
        .as_array()
        .map(|a| a.iter().map(|s| f.map(&id, s.as_str().unwrap())).collect())
        .unwrap_or_default();
    let envs: HashMap<String, String> =
        serde_json::from_value(p["envs"].clone()).unwrap_or_default();
    let cwd = f.map(&id, p["cwd"].as_str().unwrap_or("/home/user"));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let spawned = tokio::process::Command::new(&cmd)
        .args(&args)
        .envs(&envs)
        .env("HOME", f.map(&id, "/home/user"))
        .current_dir(&cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let end = json!({"error": {"code": "invalid_argument", "message": e.to_string()}});
            let _ = tx.try_send(Ok(envelope(2, &end)));
            drop(tx);
            return stream_response(rx);
        }
    };
    let pid = child.id().unwrap();
    f.pids.lock().unwrap().insert(pid, ());
    tokio::spawn(stream_process(child, pid, tx));
    stream_response(rx)
}

/// A started process's events, as envd streams them: start, its output as it comes,
/// its end, then the stream's end.
async fn stream_process(
    mut child: tokio::process::Child,
    pid: u32,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let _ = tx
        .send(Ok(envelope(0, &json!({"event": {"start": {"pid": pid}}}))))
        .await;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let (mut ob, mut eb) = ([0u8; 4096], [0u8; 4096]);
    let (mut o_open, mut e_open) = (true, true);
    while o_open || e_open {
        let (key, n) = tokio::select! {
            r = out.read(&mut ob), if o_open => ("stdout", r.unwrap_or(0)),
            r = err.read(&mut eb), if e_open => ("stderr", r.unwrap_or(0)),
        };
        if n == 0 {
            if key == "stdout" {
                o_open = false
            } else {
                e_open = false
            }
            continue;
        }
        let data = if key == "stdout" { &ob[..n] } else { &eb[..n] };
        let ev = json!({"event": {"data": {key: B64.encode(data)}}});
        if tx.send(Ok(envelope(0, &ev))).await.is_err() {
            return; // client hung up: child is killed on drop
        }
    }
    let status = child.wait().await.unwrap();
    let mut end = json!({"exited": true, "status": format!("{status}")});
    // proto3 JSON: a zero exit code is left out.
    match status.code() {
        Some(0) => {}
        Some(c) => end["exitCode"] = json!(c),
        None => end["exitCode"] = json!(-1),
    }
    let _ = tx
        .send(Ok(envelope(0, &json!({"event": {"end": end}}))))
        .await;
    let _ = tx.send(Ok(envelope(2, &json!({})))).await;
}

pub(crate) fn stream_response(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> Response {
    Response::builder()
        .header("content-type", "application/connect+json")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap()
}

async fn send_signal(State(f): State<Arc<Fake>>, h: HeaderMap, Json(req): Json<Value>) -> Response {
    if let Err(r) = sandbox_of(&f, &h) {
        return r;
    }
    assert_eq!(req["signal"], "SIGNAL_SIGKILL");
    let pid = req["process"]["pid"].as_u64().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    Json(json!({})).into_response()
}

async fn read_file(
    State(f): State<Arc<Fake>>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let id = match sandbox_of(&f, &h) {
        Ok(id) => id,
        Err(r) => return r,
    };
    match std::fs::read(f.map(&id, &q["path"])) {
        Ok(b) => b.into_response(),
        Err(_) => (
            StatusCode::NOT_FOUND,
            Json(json!({"code": 404, "message": "no such file"})),
        )
            .into_response(),
    }
}

async fn write_file(
    State(f): State<Arc<Fake>>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let id = match sandbox_of(&f, &h) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let ct = h.get("content-type").unwrap().to_str().unwrap();
    let boundary = ct.split("boundary=").nth(1).unwrap();
    let start_marker = format!("--{boundary}\r\n");
    let end_marker = format!("\r\n--{boundary}--");
    let b = &body[..];
    assert!(b.starts_with(start_marker.as_bytes()));
    let header_end = b.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let headers = String::from_utf8_lossy(&b[..header_end]);
    assert!(headers.contains("name=\"file\""), "{headers}");
    let data_end = b
        .windows(end_marker.len())
        .rposition(|w| w == end_marker.as_bytes())
        .unwrap();
    let path = f.map(&id, &q["path"]);
    if let Some(parent) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, &b[header_end..data_end]).unwrap();
    f.files_written.lock().unwrap().push((
        id.clone(),
        q["path"].clone(),
        b[header_end..data_end].to_vec(),
    ));
    Json(json!([{"name": q["path"].rsplit('/').next(), "type": "file", "path": q["path"]}]))
        .into_response()
}
