//! Where a secret must never be, read whole: every log the mesh's services wrote, and a
//! run's Temporal history with each payload decoded. The tests that give the mesh a
//! secret (model keys, fork tokens, git credentials) look for it here.

use crate::{Mesh, mesh::temporal_cli};
use std::path::{Path, PathBuf};

/// Every `*.log` file under `dir`, however deep (links not followed).
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let (path, kind) = (entry.path(), entry.file_type());
            if kind.as_ref().is_ok_and(std::fs::FileType::is_dir) {
                dirs.push(path);
            } else if kind.is_ok_and(|k| k.is_file())
                && path.extension().is_some_and(|e| e == "log")
            {
                found.push(path);
            }
        }
    }
    found
}

/// A run's Temporal history: `raw` as the server gives it, `decoded` every payload's
/// data (base64 in the JSON) as text, one per line.
pub struct History {
    pub raw: String,
    pub decoded: String,
}

/// The history of workflow `run_id` (`temporal workflow show`).
pub fn history(mesh: &Mesh, run_id: &str) -> History {
    match try_history(mesh, run_id) {
        Ok(h) => h,
        Err(why) => panic!("the history of {run_id}: {why}"),
    }
}

/// The history of workflow `id`, or why there is none (no such workflow).
pub fn try_history(mesh: &Mesh, id: &str) -> Result<History, String> {
    let out = std::process::Command::new(temporal_cli())
        .args(["workflow", "show", "--output", "json", "--workflow-id", id])
        .args([
            "--address",
            &mesh.temporal_address(),
            "--namespace",
            "default",
        ])
        .output()
        .expect("temporal workflow show");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("history as JSON");
    let mut decoded = String::new();
    payload_texts(&json, &mut decoded);
    Ok(History {
        raw: json.to_string(),
        decoded,
    })
}

/// The histories of a run of `forks` forks: its own, and those of its fork children
/// (`<run>/fork-<n>`, where a fork ran as a child) and of its forks published later
/// (`<run>/publish-<n>`), each with its workflow id.
pub fn run_histories(mesh: &Mesh, run_id: &str, forks: u32) -> Vec<(String, History)> {
    let mut out = vec![(run_id.to_owned(), history(mesh, run_id))];
    for n in 1..=forks {
        for id in [
            format!("{run_id}/fork-{n}"),
            format!("{run_id}/publish-{n}"),
        ] {
            if let Ok(h) = try_history(mesh, &id) {
                out.push((id, h));
            }
        }
    }
    out
}

/// Every `data` string under `v`, base64-decoded, appended to `out`.
fn payload_texts(v: &serde_json::Value, out: &mut String) {
    use base64::Engine;
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if k == "data"
                    && let Some(text) = v.as_str()
                    && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text)
                {
                    out.push_str(&String::from_utf8_lossy(&bytes));
                    out.push('\n');
                }
                payload_texts(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| payload_texts(v, out)),
        _ => {}
    }
}
