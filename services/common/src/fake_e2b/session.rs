//! The rest of the fake E2B server: pause/resume (with the resume's timeout recorded),
//! and envd's pty commands — `process.Process/Start` with `pty.size` runs the command on
//! a real pseudo-terminal as its controlling terminal (util-linux `setsid --ctty`, as
//! envd does with its own pty library), output as `data.pty`; `SendInput` with
//! `input.pty` writes keystrokes; `Update` with `pty.size` resizes.

use super::{Fake, envelope, gate, sandbox_of, stream_response};
use axum::{
    Json,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use base64::{Engine, engine::general_purpose::STANDARD as B64};
use rustix::{
    fs::{Mode, OFlags},
    pty::OpenptFlags,
    termios::Winsize,
};
use serde_json::{Value, json};
use std::{io::Read, io::Write, os::unix::process::ExitStatusExt, sync::Arc};

pub async fn pause(State(f): State<Arc<Fake>>, h: HeaderMap, Path(id): Path<String>) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    if !f.sandboxes.lock().unwrap().contains_key(&id) {
        return StatusCode::NOT_FOUND.into_response();
    }
    f.paused.lock().unwrap().insert(id);
    StatusCode::NO_CONTENT.into_response()
}

pub async fn resume(
    State(f): State<Arc<Fake>>,
    h: HeaderMap,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&f, &h).await {
        return r;
    }
    if !f.paused.lock().unwrap().remove(&id) {
        // E2B answers 409 when the sandbox is not paused.
        return StatusCode::CONFLICT.into_response();
    }
    let t = body["timeout"].as_u64().expect("resume timeout in seconds");
    f.timeouts.lock().unwrap().push((id.clone(), "resume", t));
    (
        StatusCode::CREATED,
        Json(json!({"sandboxID": id, "templateID": "base", "clientID": "fake"})),
    )
        .into_response()
}

fn winsize(size: &Value) -> Winsize {
    Winsize {
        ws_row: u16::try_from(size["rows"].as_u64().unwrap()).unwrap(),
        ws_col: u16::try_from(size["cols"].as_u64().unwrap()).unwrap(),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

pub fn start_pty(f: &Arc<Fake>, id: &str, req: &Value) -> Response {
    let p = &req["process"];
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    rustix::termios::tcsetwinsize(&master, winsize(&req["pty"]["size"])).unwrap();
    let args: Vec<String> = p["args"]
        .as_array()
        .map(|a| a.iter().map(|s| f.map(id, s.as_str().unwrap())).collect())
        .unwrap_or_default();
    let envs: std::collections::HashMap<String, String> =
        serde_json::from_value(p["envs"].clone()).unwrap_or_default();
    let stdio = || std::process::Stdio::from(slave.try_clone().unwrap());
    let mut child = std::process::Command::new("setsid")
        .args(["--wait", "--ctty", "--"])
        .arg(p["cmd"].as_str().unwrap())
        .args(&args)
        .envs(&envs)
        .current_dir(f.map(id, p["cwd"].as_str().unwrap_or("/home/user")))
        .stdin(stdio())
        .stdout(stdio())
        .stderr(stdio())
        .spawn()
        .unwrap();
    drop(slave);
    let pid = child.id();
    let master = std::fs::File::from(master);
    let mut reader = master.try_clone().unwrap();
    f.ptys.lock().unwrap().insert(pid, master);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let fake = f.clone();
    std::thread::spawn(move || {
        let send = |v: Value| tx.blocking_send(Ok(envelope(0, &v)));
        let _ = send(json!({"event": {"start": {"pid": pid}}}));
        let mut buf = [0u8; 4096];
        // EIO once the command and its children closed the terminal.
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            if send(json!({"event": {"data": {"pty": B64.encode(&buf[..n])}}})).is_err() {
                let _ = child.kill();
                break;
            }
        }
        let status = child.wait().unwrap();
        fake.ptys.lock().unwrap().remove(&pid);
        let _ = send(json!({"event": {"end": end_event(status)}}));
        let _ = tx.blocking_send(Ok(envelope(2, &json!({}))));
    });
    stream_response(rx)
}

/// A process's end as envd (Go) reports it: exit code -1 and "signal: <name>" for a
/// signal death.
fn end_event(status: std::process::ExitStatus) -> Value {
    match (status.code(), status.signal()) {
        (Some(0), _) => json!({"exited": true, "status": "exit status 0"}),
        (Some(c), _) => {
            json!({"exited": true, "exitCode": c, "status": format!("exit status {c}")})
        }
        (None, sig) => {
            let name = match sig {
                Some(2) => "interrupt",
                Some(9) => "killed",
                Some(15) => "terminated",
                _ => "unknown signal",
            };
            json!({"exited": false, "exitCode": -1, "status": format!("signal: {name}")})
        }
    }
}

fn unary_checks(h: &HeaderMap) {
    assert_eq!(h.get("content-type").unwrap(), "application/json");
    assert_eq!(h.get("connect-protocol-version").unwrap(), "1");
}

fn no_process() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"code": "not_found", "message": "process not found"})),
    )
        .into_response()
}

pub async fn send_input(State(f): State<Arc<Fake>>, h: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = sandbox_of(&f, &h) {
        return r;
    }
    unary_checks(&h);
    let req: Value = serde_json::from_slice(&body).unwrap();
    let pid = u32::try_from(req["process"]["pid"].as_u64().unwrap()).unwrap();
    let data = B64
        .decode(req["input"]["pty"].as_str().expect("pty input"))
        .unwrap();
    match f.ptys.lock().unwrap().get_mut(&pid) {
        Some(m) => m.write_all(&data).unwrap(),
        None => return no_process(),
    }
    Json(json!({})).into_response()
}

pub async fn update(State(f): State<Arc<Fake>>, h: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = sandbox_of(&f, &h) {
        return r;
    }
    unary_checks(&h);
    let req: Value = serde_json::from_slice(&body).unwrap();
    let pid = u32::try_from(req["process"]["pid"].as_u64().unwrap()).unwrap();
    match f.ptys.lock().unwrap().get(&pid) {
        Some(m) => rustix::termios::tcsetwinsize(m, winsize(&req["pty"]["size"])).unwrap(),
        None => return no_process(),
    }
    Json(json!({})).into_response()
}
