//! End to end, the `forkyard` command against the mesh: its output and the exit codes
//! scripts use.

use forkyard_proto::gateway::v1::RunState;
use forkyard_tests::fixture::setup;
use std::path::Path;

/// The `forkyard` command, pointed at the mesh's gateway.
struct Cli {
    gateway: String,
}

impl Cli {
    /// Its exit code, stdout and stderr.
    fn run(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = std::process::Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
            .arg("--gateway")
            .arg(&self.gateway)
            .args(args)
            .output()
            .expect("forkyard runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Two forks of `agent` on `repo`, waited for, the run printed as JSON.
fn fork_args<'a>(repo: &'a str, agent: &'a str) -> Vec<&'a str> {
    vec![
        "fork",
        repo,
        "-p",
        "add a note",
        "-f",
        "2",
        "--max-concurrent",
        "2",
        "--budget",
        "1",
        "--agent-command",
        agent,
        "--wait",
        "-o",
        "json",
    ]
}

/// A run that completes, printed in the standard protobuf JSON mapping (as grpcurl
/// prints it): its id.
fn fork_and_wait(cli: &Cli, repo: &str) -> String {
    let (code, out, err) = cli.run(&fork_args(repo, "echo \"$FORKYARD_PROMPT\" > note.txt"));
    assert_eq!(code, Some(0), "{out}\n{err}");
    let run: serde_json::Value = serde_json::from_str(&out).expect("json run");
    assert_eq!(run["state"], RunState::Completed.as_str_name(), "{out}");
    assert_eq!(run["forks"][0]["status"], "FORK_STATUS_SUCCEEDED", "{out}");
    run["runId"].as_str().unwrap().to_owned()
}

fn assert_result_saves_the_patch(cli: &Cli, src: &Path, run_id: &str) {
    let patch_file = src.join("fork-1.patch");
    let (code, _, err) = cli.run(&[
        "result",
        run_id,
        "1",
        "--save",
        patch_file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        std::fs::read_to_string(&patch_file)
            .unwrap()
            .contains("+add a note")
    );
}

fn assert_status_and_list_show_the_run(cli: &Cli, run_id: &str) {
    let (code, out, _) = cli.run(&["status", run_id]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("succeeded") && out.contains("forkyard-fork-2"),
        "{out}"
    );
    let (code, out, _) = cli.run(&["list", "-o", "json"]);
    assert_eq!(code, Some(0));
    let list: serde_json::Value = serde_json::from_str(&out).expect("json list");
    assert!(
        list["runs"]
            .as_array()
            .is_some_and(|runs| runs.iter().any(|r| r["runId"] == run_id)),
        "{out}"
    );
    // People read times, not unix milliseconds.
    let (code, out, _) = cli.run(&["list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(" ago)") && out.contains('T'), "{out}");
}

/// 2 for a run with some fork failed, 3 for a failed run, 1 for a refusal, 64 for bad
/// usage.
fn assert_exit_codes(cli: &Cli, repo: &str) {
    let (code, _, _) = cli.run(&fork_args(repo, "[ \"$FORKYARD_FORK\" = 1 ] || exit 3"));
    assert_eq!(code, Some(2), "some fork failed");
    let (code, _, _) = cli.run(&fork_args(repo, "exit 3"));
    assert_eq!(code, Some(3), "every fork failed: the run failed");
    let (code, _, err) = cli.run(&["status", "run-nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = cli.run(&[
        "fork",
        repo,
        "-p",
        "x",
        "--agent-command",
        "true",
        "-f",
        "0",
    ]);
    assert_eq!(code, Some(1), "refused by the gateway: {err}");
    assert!(err.contains("forks"), "{err}");
    let (code, _, _) = cli.run(&["fork", "--no-such-flag"]);
    assert_eq!(code, Some(64), "bad usage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drives_runs_with_exit_codes_scripts_can_rely_on() {
    let (mesh, src, _gw) = setup().await;
    let cli = Cli {
        gateway: mesh.endpoint("gateway"),
    };
    let repo = src.path().to_str().unwrap();
    let run_id = fork_and_wait(&cli, repo);
    assert_result_saves_the_patch(&cli, src.path(), &run_id);
    assert_status_and_list_show_the_run(&cli, &run_id);
    assert_exit_codes(&cli, repo);
}
