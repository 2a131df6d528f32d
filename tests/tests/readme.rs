//! The README's commands work as written (issue 48): every shell line of its `sh` blocks
//! is read as a shell would split it, and
//! - each `grpcurl` call runs against a real mesh (its ports for the README's 50051 and
//!   50055, a real repository for `/path/to/repo`) and must succeed;
//! - each `forkyard` command line is parsed by the real CLI (against a gateway that is
//!   not there): an unknown flag, a missing value or a subcommand that no longer exists
//!   is a usage error (exit 64) and fails here;
//! - each `make` target named has a rule in the Makefile.
//!
//! - and each `forkyard` command runs as written against a real mesh (`readme/runs.rs`).
//!
//! So a README that drifts from the CLI, the Makefile or the API fails `make test`.

mod agent_cli;
#[path = "readme/runs.rs"]
mod runs;

use forkyard_tests::{Mesh, mesh::bin_dir, repo};
use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A command line, split into words.
type Words = Vec<String>;

/// Every command of the README's `sh` blocks, split into words: continuation lines
/// joined, comments and redirections dropped, leading `VAR=value` assignments removed.
fn commands() -> Vec<Words> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            pending.clear();
            continue;
        }
        if !in_sh {
            continue;
        }
        pending.push_str(line);
        pending.push('\n');
        if line.ends_with('\\') {
            continue; // continued on the next line
        }
        let joined = pending.replace("\\\n", " ");
        let Some(words) = shlex::split(&joined) else {
            continue; // a quote still open: the command goes on
        };
        pending.clear();
        let words: Vec<String> = words
            .into_iter()
            .skip_while(|w| w.split_once('=').is_some_and(|(k, _)| is_var(k)))
            .take_while(|w| !w.starts_with('>') && w != "|")
            .collect();
        if !words.is_empty() {
            out.push(words);
        }
    }
    out
}

fn is_var(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

#[test]
fn the_readme_has_commands_of_each_kind() {
    let all = commands();
    for tool in ["forkyard", "make", "grpcurl"] {
        let n = all.iter().filter(|c| c[0] == tool).count();
        assert!(n >= 3, "{tool}: {n} commands read from the README: {all:?}");
    }
}

#[test]
fn every_make_target_the_readme_names_exists() {
    // The Makefile's rules, read as text: `make -n` would run every recursive `$(MAKE)`.
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let rules: Vec<&str> = makefile
        .lines()
        .filter(|l| !l.starts_with(['\t', '#', '.', ' ']))
        .filter_map(|l| l.split_once(':').map(|(t, _)| t.trim()))
        .filter(|t| !t.contains(['=', '$', ' ']))
        .collect();
    assert!(rules.contains(&"demo"), "{rules:?}");
    for cmd in commands().into_iter().filter(|c| c[0] == "make") {
        for target in cmd[1..].iter().filter(|w| !w.starts_with('-')) {
            assert!(
                rules.contains(&target.as_str()),
                "{cmd:?}: no rule {target} in the Makefile"
            );
        }
    }
}

#[test]
fn every_forkyard_command_in_the_readme_parses() {
    let state = tempfile::tempdir().unwrap();
    // What the README's commands name in the directory they run in.
    std::fs::write(state.path().join("task.md"), "fix the flaky test\n").unwrap();
    let mut checked = 0;
    for cmd in commands().into_iter().filter(|c| c[0] == "forkyard") {
        let args: Vec<String> = cmd[1..].iter().map(|w| placeholder(w)).collect();
        let out = Command::new(bin_dir().join("forkyard"))
            .args(&args)
            // A gateway that is not there: the command parses, then cannot connect.
            .env("FORKYARD_GATEWAY", "http://127.0.0.1:1")
            .env("FORKYARD_STATE_DIR", state.path())
            .env("FORKYARD_CONFIG", state.path().join("config.toml"))
            .current_dir(state.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(
            out.status.code(),
            Some(64),
            "{cmd:?} is not a valid command: {stderr}"
        );
        assert!(!stderr.contains("unexpected argument"), "{cmd:?}: {stderr}");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} forkyard commands checked");
}

/// The README's placeholders as a command line can take them.
fn placeholder(word: &str) -> String {
    match word {
        "run-…" => "run-readme".into(),
        "…" => "a task".into(),
        w => w.replace('…', "x"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grpcurl_call_in_the_readme_runs_against_the_mesh() {
    let mesh = Mesh::start().await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    repo::create(dir.path()).unwrap();
    let gateway = format!("127.0.0.1:{}", mesh.port("gateway"));
    let janitor = format!("127.0.0.1:{}", mesh.port("janitor"));
    let calls: Vec<Vec<String>> = commands()
        .into_iter()
        .filter(|c| c[0] == "grpcurl")
        .collect();
    assert!(
        calls
            .iter()
            .any(|c| c.iter().any(|w| w.ends_with("/LaunchRun")))
    );
    for call in calls {
        let args: Vec<String> = call[1..]
            .iter()
            .map(|w| {
                w.replace("127.0.0.1:50051", &gateway)
                    .replace("127.0.0.1:50055", &janitor)
                    .replace("/path/to/repo", &dir.path().display().to_string())
            })
            .collect();
        let out = Command::new("grpcurl")
            .args(["-max-time", "120"])
            .args(&args)
            .output()
            .expect("grpcurl (make deps installs it)");
        assert!(
            out.status.success(),
            "{call:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
