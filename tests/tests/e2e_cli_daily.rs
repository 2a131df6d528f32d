//! The CLI as a daily tool against the real mesh: a context instead of --gateway, the
//! prompt from a file, the winner's patch applied to a clone of the repository, run
//! ids completed from the gateway, YAML as kubectl prints it and --jq as gh takes it.

use forkyard_tests::{fixture::setup, mesh::bin_dir};
use std::{path::Path, process::Command};

/// `forkyard args…` with the test's own config file: (exit code, stdout, stderr).
fn forkyard(config: &Path, dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin_dir().join("forkyard"))
        .args(args)
        .env("FORKYARD_CONFIG", config)
        .env_remove("FORKYARD_GATEWAY")
        .env_remove("FORKYARD_API_KEY")
        .current_dir(dir)
        .output()
        .expect("forkyard runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fork 1 fails; fork 2 writes the prompt into NOTE.md and succeeds: the winner.
const AGENT: &str =
    r#"[ "$FORKYARD_FORK" = 2 ] || exit 3; printf '%s' "$FORKYARD_PROMPT" > NOTE.md"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_a_prompt_file_and_the_winner_applied_here() {
    let (mesh, src, _gw) = setup().await;
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.toml");
    let here = work.path();
    let cli = |args: &[&str]| forkyard(&config, here, args);
    let gateway = mesh.endpoint("gateway");
    let (code, _, err) = cli(&[
        "config",
        "set-context",
        "mesh",
        "--gateway",
        &gateway,
        "--current",
    ]);
    assert_eq!(code, Some(0), "{err}");

    std::fs::write(here.join("task.md"), "write the note\n").unwrap();
    let repo = src.path().to_str().unwrap();
    let (code, out, err) = cli(&[
        "fork",
        repo,
        "-p",
        "@task.md",
        "-f",
        "2",
        "--max-concurrent",
        "2",
        "--budget",
        "1",
        "--agent-command",
        AGENT,
        "--wait",
        "--jq",
        ".runId",
    ]);
    assert_eq!(code, Some(2), "one fork failed: {out}\n{err}");
    let run_id = out.trim().to_owned();

    let (code, out, err) = cli(&["result", &run_id, "--winner", "-q", ".fork"]);
    assert_eq!((code, out.as_str()), (Some(0), "2\n"), "{err}");
    let (code, out, _) = cli(&["-o", "yaml", "status", &run_id]);
    assert_eq!(code, Some(0));
    assert!(out.starts_with(&format!("runId: {run_id}\n")), "{out}");
    assert!(out.contains("\n- fork: 1\n"), "{out}");

    // The winner's patch onto a clone of the repository, staged.
    let clone = here.join("clone");
    git(here, &["clone", "-q", repo, "clone"]);
    let (code, _, err) = forkyard(&config, &clone, &["apply", &run_id]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("applied fork 2 of {run_id}")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("NOTE.md")).unwrap(),
        "write the note\n"
    );
    assert_eq!(
        git(&clone, &["diff", "--cached", "--name-only"]),
        "NOTE.md\n"
    );
    // Applied: the checkout now has changes, so a second apply is refused.
    let (code, _, err) = forkyard(&config, &clone, &["apply", &run_id]);
    assert_eq!(code, Some(1));
    assert!(err.contains("uncommitted changes (NOTE.md)"), "{err}");

    // The shell's TAB on `forkyard status run-`: the run, from the context's gateway.
    let out = Command::new(bin_dir().join("forkyard"))
        .args(["--", "forkyard", "status", "run-"])
        .env("COMPLETE", "fish")
        .env("FORKYARD_CONFIG", &config)
        .env_remove("FORKYARD_GATEWAY")
        .output()
        .unwrap();
    let offered = String::from_utf8_lossy(&out.stdout);
    assert!(
        offered
            .lines()
            .any(|l| l.starts_with(&format!("{run_id}\tcompleted"))),
        "{offered}"
    );
}
