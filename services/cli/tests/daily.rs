//! The CLI as a daily tool, against a gateway in the test's process: `-o yaml` as
//! kubectl prints, `--jq` as gh takes it, the prompt from a file or standard input, run
//! ids completed by the shells, a watch that ends on the run's final event, and a
//! closed standard output that ends every command quietly.

mod common;

use common::{Fake, forkyard, ok, stderr};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{Run, RunEvent, RunState, run_event::Kind},
};
use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

fn run(id: &str, state: RunState) -> Run {
    Run {
        run_id: id.into(),
        state: state as i32,
        started_unix_ms: 1_700_000_000_000,
        winner: 1,
        forks: vec![ForkResult {
            fork: 1,
            status: ForkStatus::Succeeded as i32,
            ..Default::default()
        }],
        forks_succeeded: 1,
        ..Default::default()
    }
}

async fn gateway() -> (Fake, String) {
    let fake = Fake::default();
    {
        let mut c = fake.0.lock().unwrap();
        c.runs = vec![
            run("run-aa1", RunState::Completed),
            run("run-aa2", RunState::Running),
            run("run-b", RunState::Failed),
        ];
        c.forks.insert(
            ("run-aa1".into(), 1),
            ForkResult {
                fork: 1,
                patch: "diff --git a/x b/x\n".into(),
                ..Default::default()
            },
        );
        let finished = RunEvent {
            kind: Kind::RunFinished as i32,
            run: Some(run("run-aa1", RunState::Completed)),
            ..Default::default()
        };
        c.events = vec![
            RunEvent {
                kind: Kind::Snapshot as i32,
                run: Some(run("run-aa1", RunState::Running)),
                ..Default::default()
            },
            finished,
        ];
    }
    let endpoint = fake.serve().await;
    (fake, endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_prints_as_kubectl_and_jq_filters_as_gh() {
    let (_fake, gw) = gateway().await;
    let out = forkyard(
        &["--gateway", &gw, "-o", "yaml", "status", "run-aa1"],
        &[],
        None,
    );
    let yaml = ok(&out, 0);
    assert!(
        yaml.starts_with("runId: run-aa1\nstate: RUN_STATE_COMPLETED\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("forks:\n- fork: 1\n  status: FORK_STATUS_SUCCEEDED\n"),
        "{yaml}"
    );
    let out = forkyard(
        &["--gateway", &gw, "list", "--jq", ".runs[].runId"],
        &[],
        None,
    );
    assert_eq!(ok(&out, 0), "run-aa1\nrun-aa2\nrun-b\n");
    let out = forkyard(
        &["--gateway", &gw, "result", "run-aa1", "1", "-q", ".patch"],
        &[],
        None,
    );
    assert_eq!(ok(&out, 0), "diff --git a/x b/x\n\n");
    // Usage errors: a bad expression, or --jq with another output.
    let out = forkyard(&["--gateway", &gw, "list", "--jq", ".runs["], &[], None);
    ok(&out, 64);
    assert!(stderr(&out).contains("expected"), "{}", stderr(&out));
    ok(
        &forkyard(
            &["--gateway", &gw, "list", "--jq", ".", "-o", "yaml"],
            &[],
            None,
        ),
        64,
    );
    // A filter that fails on the answer is an error, not a usage error.
    let out = forkyard(&["--gateway", &gw, "list", "--jq", ".runs.x"], &[], None);
    ok(&out, 1);
    assert!(
        stderr(&out).starts_with("error: --jq: cannot index"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_comes_from_a_file_or_standard_input() {
    let (_fake, gw) = gateway().await;
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("task.md");
    let text = "# Task\n\nMake the flaky test pass.\n";
    std::fs::write(&task, text).unwrap();
    let at = format!("@{}", task.display());
    let args = [
        "--gateway",
        &gw,
        "fork",
        ".",
        "-p",
        &at,
        "--agent-command",
        "true",
    ];
    // The fake names the run after the prompt's length.
    assert_eq!(
        ok(&forkyard(&args, &[], None), 0),
        format!("run-prompt-{}\n", text.len())
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_forkyard"))
        .args([
            "--gateway",
            &gw,
            "fork",
            ".",
            "-p",
            "-",
            "--agent-command",
            "true",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(ok(&out, 0), "run-prompt-10\n");

    let out = forkyard(
        &["--gateway", &gw, "fork", ".", "-p", "@/nonexistent.md"],
        &[],
        None,
    );
    ok(&out, 1);
    assert!(
        stderr(&out).contains("-p @/nonexistent.md: "),
        "{}",
        stderr(&out)
    );
}

/// `COMPLETE=<shell> forkyard -- <words>` is what each shell's script runs at a TAB.
fn complete(shell: &str, words: &[&str], gw: &str) -> String {
    let index = (words.len() - 1).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_forkyard"))
        .env("COMPLETE", shell)
        .env("FORKYARD_GATEWAY", gw)
        .env("FORKYARD_CONFIG", "/nonexistent/config.toml")
        .env("_CLAP_COMPLETE_INDEX", &index)
        .env("_CLAP_COMPLETE_COMP_TYPE", "9")
        .env("_CLAP_COMPLETE_SPACE", "true")
        .env("_CLAP_IFS", "\n")
        .arg("--")
        .args(words)
        .output()
        .unwrap();
    ok(&out, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ids_are_completed_in_bash_zsh_and_fish() {
    let (_fake, gw) = gateway().await;
    let bash = complete("bash", &["forkyard", "status", "run-a"], &gw);
    assert_eq!(
        bash.split_whitespace().collect::<Vec<_>>(),
        ["run-aa1", "run-aa2"]
    );
    let zsh = complete("zsh", &["forkyard", "watch", "run-"], &gw);
    assert!(
        zsh.contains("run-aa1:completed, started") && zsh.contains("run-b:failed"),
        "{zsh}"
    );
    let fish = complete("fish", &["forkyard", "apply", "run-aa"], &gw);
    assert!(fish.contains("run-aa2\trunning, started"), "{fish}");
    // Everywhere a run id is taken, even after other flags.
    let bash = complete(
        "bash",
        &["forkyard", "-o", "json", "result", "--winner", "run-b"],
        &gw,
    );
    assert_eq!(bash.trim(), "run-b");
    // The rest is clap's: subcommands, flags.
    assert!(complete("fish", &["forkyard", "con"], &gw).contains("config"));
    // No gateway there: nothing offered, no error on the shell's line.
    let none = complete(
        "bash",
        &["forkyard", "status", "run-"],
        "http://127.0.0.1:9",
    );
    assert_eq!(none.trim(), "");
}

#[test]
fn the_completion_scripts_call_the_binary_back() {
    for (shell, needle) in [
        ("bash", "-F _clap_complete_forkyard forkyard"),
        ("zsh", "#compdef forkyard"),
        (
            "fish",
            "complete --keep-order --exclusive --command forkyard",
        ),
    ] {
        let out = forkyard(&["completion", shell], &[], None);
        let script = ok(&out, 0);
        assert!(script.contains(needle), "{shell}: {script}");
        assert!(
            script.contains("COMPLETE=") || script.contains("COMPLETE \""),
            "{shell}: {script}"
        );
    }
}

/// The stream stays open after the final event (as a gateway's may, a proxy's will):
/// the watch ends on the event, not on the stream's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ends_on_the_runs_final_event() {
    let (_fake, gw) = gateway().await;
    let started = Instant::now();
    let out = forkyard(
        &["--gateway", &gw, "watch", "run-aa1", "-o", "json"],
        &[],
        None,
    );
    let took = started.elapsed();
    let json = ok(&out, 0);
    assert!(json.contains("RUN_STATE_COMPLETED"), "{json}");
    assert!(took < Duration::from_secs(2), "the watch took {took:?}");
}

/// `forkyard … | head`: the reader gone before the CLI writes, every command that
/// prints ends with status 0 and says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_standard_output_ends_every_command_quietly() {
    let (_fake, gw) = gateway().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fy.toml");
    let cfg = config.to_str().unwrap();
    ok(
        &forkyard(
            &["config", "set-context", "a", "--gateway", &gw, "--current"],
            &[("FORKYARD_CONFIG", cfg)],
            None,
        ),
        0,
    );
    let commands: [&[&str]; 8] = [
        &["list"],
        &["-o", "yaml", "status", "run-aa1"],
        &["list", "--jq", ".runs[]"],
        &["result", "run-aa1", "--winner"],
        &["watch", "run-aa1"],
        &["config", "get-contexts"],
        &["config", "current-context"],
        &["completion", "fish"],
    ];
    for args in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_forkyard"))
            .args(["--gateway", &gw])
            .args(args)
            .env("FORKYARD_CONFIG", cfg)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
}
