//! The README's `forkyard` commands run as written against a real mesh, in the order the
//! README gives them, from a directory holding what they name (`./my-repo`, a Rust crate
//! whose test fails until the agent fixes it; `task.md`; `agent.sh`): the headline
//! Claude Code fork (the real `claude` CLI against the scripted model) verified by
//! `cargo test` in every sandbox, its patch saved, a run watched, listed, steered and
//! cancelled, contexts, the prompt from a file, the winner applied to the checkout. Only
//! the words the README leaves to the reader are filled in: `run-…` is the run the
//! section is about (the last one launched; for pause, resume, cancel and budget raise a
//! run still running, launched by the test), `…` a prompt.

use super::{Words, commands};
use crate::agent_cli::model_mesh::{assert_cli_installed, options};
use forkyard_proto::{
    common::v1::VerifyStatus,
    gateway::v1::{PauseRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    mesh::bin_dir,
    repo,
    scripted_model::{Script, ScriptedModel},
    support::{Gateway, get_run, launch},
};
use std::{path::Path, process::Command};

/// README commands that cannot run here, each with why and where the same thing is
/// tested against local servers. A command of the README neither run nor listed here
/// fails the test, and so does an entry that no longer matches a command.
const NOT_HERE: &[(&str, &str)] = &[
    (
        "https://github.com/",
        "GitHub is not reachable here: e2e_private_claude and e2e_delivery run the same \
         flags against git http-backend, sshd and a fake GitHub",
    ),
    (
        "https://git.internal/",
        "no git.internal here, and this test's mesh is no `make up`: e2e_local_stack_git runs \
         the README's printf, `FORKYARD_GIT_CREDENTIALS=… make up` and this fork from the \
         README's text against a local git http-backend, all but `--pr each` (its GitLab \
         API would be https://<host>/api/v4, which no local server answers); e2e_delivery \
         opens merge requests on a fake GitLab",
    ),
    (
        "publish",
        "a pull request needs a forge: e2e_delivery publishes to a fake GitHub",
    ),
];

/// The crate `./my-repo` is: its one test fails until `answer` returns 42.
const LIB_RS: &str = "pub fn answer() -> u32 {\n    41\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn answers() {\n        assert_eq!(super::answer(), 42);\n    }\n}\n";
/// What the scripted model has Claude Code run in each fork.
const FIX: &str = "sed -i s/41/42/ src/lib.rs";

/// The active rustup toolchain, as `make up` offers it to sandboxes.
fn rust_toolchain() -> String {
    let out = Command::new("rustc").args(["--print", "sysroot"]).output();
    let sysroot = out.expect("rustc").stdout;
    format!("rust={}", String::from_utf8_lossy(&sysroot).trim())
}

/// The README's working directory: a checkout (`.`, with `task.md` and `agent.sh`) that
/// holds `my-repo` (a crate of its own, with `my-agent.sh`).
fn workdir(dir: &Path) {
    repo::create(dir).unwrap();
    std::fs::write(dir.join("task.md"), "fix the flaky test\n").unwrap();
    let agent = "#!/bin/sh\necho \"$FORKYARD_PROMPT\" >> NOTES.md\n";
    executable(&dir.join("agent.sh"), agent);
    std::fs::write(dir.join(".gitignore"), "/my-repo/\n*.patch\n/ca.pem\n").unwrap();
    repo::commit_all(dir, "the readme's checkout").unwrap();
    let crate_dir = dir.join("my-repo");
    repo::create(&crate_dir).unwrap();
    let manifest = "[package]\nname = \"my-repo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n";
    std::fs::write(crate_dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(crate_dir.join("src/lib.rs"), LIB_RS).unwrap();
    std::fs::write(crate_dir.join(".gitignore"), "/target/\n/Cargo.lock\n").unwrap();
    let my_agent = "#!/bin/sh\nsleep 1\necho \"$FORKYARD_PROMPT\" >> NOTES.md\n";
    executable(&crate_dir.join("my-agent.sh"), my_agent);
    repo::commit_all(&crate_dir, "a crate whose test fails").unwrap();
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A README command's run: where, its exit code and its output.
struct Ran {
    dir: std::path::PathBuf,
    code: Option<i32>,
    out: String,
}

/// `forkyard <args>` in `dir` against the mesh; contexts in `config`.
fn forkyard(dir: &Path, gateway: &str, config: &Path, args: &[String]) -> Ran {
    let out = Command::new(bin_dir().join("forkyard"))
        .args(args)
        .env("FORKYARD_GATEWAY", gateway)
        .env("FORKYARD_CONFIG", config)
        .env_remove("FORKYARD_CONTEXT")
        .env_remove("FORKYARD_OUTPUT")
        .current_dir(dir)
        .output()
        .unwrap();
    Ran {
        dir: dir.to_owned(),
        code: out.status.code(),
        out: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// A run of `sleep` forks still running (`paused`: and paused), for the commands that
/// steer one.
async fn live_run(gw: &mut Gateway, dir: &Path, paused: bool) -> String {
    let req = launch(&dir.join("my-repo"), 3, 3, "sleep 300");
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    forkyard_tests::support::wait_until(gw, &run_id, std::time::Duration::from_secs(60), |r| {
        r.forks.iter().filter(|f| f.started_unix_ms > 0).count() == 3
    })
    .await;
    if paused {
        let pause = PauseRunRequest {
            run_id: run_id.clone(),
        };
        gw.pause_run(pause).await.unwrap();
    }
    run_id
}

/// The run id a `forkyard fork` printed.
fn launched(out: &str) -> Option<String> {
    let at = out.find("run-")?;
    let id: String = out[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    Some(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forkyard_command_in_the_readme_runs_against_the_mesh() {
    assert_cli_installed("claude");
    let model = ScriptedModel::start(Script::edit(FIX)).await;
    let mut opts = options(&model);
    opts.service_env.push((
        "sandbox-provisioner".into(),
        "FORKYARD_TOOLCHAINS".into(),
        rust_toolchain(),
    ));
    let mesh = Mesh::start_with(opts).await.expect("mesh");
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let gateway = mesh.endpoint("gateway");
    let dir = tempfile::tempdir().unwrap();
    workdir(dir.path());
    let (config, contexts) = (
        dir.path().join("no-config.toml"),
        dir.path().join("config.toml"),
    );
    std::fs::write(dir.path().join("ca.pem"), "a CA the README names\n").unwrap();

    let mut last_run: Option<String> = None;
    let mut unused: Vec<&str> = NOT_HERE.iter().map(|(k, _)| *k).collect();
    let mut ran = 0;
    for cmd in commands().into_iter().filter(|c| c[0] == "forkyard") {
        if let Some((key, _)) = NOT_HERE
            .iter()
            .find(|(k, _)| cmd.iter().any(|w| w.contains(k)))
        {
            unused.retain(|u| u != key);
            continue;
        }
        let verb = cmd.iter().skip(1).find(|w| !w.starts_with('-')).cloned();
        let run = match verb.as_deref() {
            Some(v @ ("pause" | "resume" | "cancel" | "budget")) => {
                Some(live_run(&mut gw, dir.path(), v == "resume").await)
            }
            _ => last_run.clone(),
        };
        let args = fill(&cmd[1..], run.as_deref());
        let config = if verb.as_deref() == Some("config") {
            &contexts
        } else {
            &config
        };
        let got = forkyard(dir.path(), &gateway, config, &args);
        check(&cmd, &got, &mut gw).await;
        if verb.as_deref() == Some("fork") {
            last_run = Some(
                launched(&got.out).unwrap_or_else(|| panic!("{cmd:?}: no run id: {}", got.out)),
            );
        }
        ran += 1;
    }
    assert!(
        unused.is_empty(),
        "NOT_HERE entries that match no README command: {unused:?}"
    );
    assert!(ran >= 20, "{ran} README commands ran");
    applied_to_the_checkout(dir.path());
}

/// The README's words with what it leaves to the reader filled in.
fn fill(words: &[String], run: Option<&str>) -> Words {
    words
        .iter()
        .map(|w| match w.as_str() {
            "run-…" | "run-3f2a…" => run.expect("a run launched before").to_owned(),
            "…" => "add a line to NOTES.md".to_owned(),
            w => w.to_owned(),
        })
        .collect()
}

/// What a user of each command would look at: its exit code, and for the commands that
/// make something, that it is there.
async fn check(cmd: &[String], got: &Ran, gw: &mut Gateway) {
    let has = |w: &str| cmd.iter().any(|c| c == w);
    if has("fork") && has("--stop-on-first-verified") {
        // The forks stopped when one verified count as not succeeded: exit 2, documented.
        assert!(matches!(got.code, Some(0 | 2)), "{cmd:?}: {}", got.out);
    } else {
        assert_eq!(got.code, Some(0), "{cmd:?}: {}", got.out);
    }
    if has("fork") && has("--verify") {
        let run = get_run(gw, &launched(&got.out).unwrap()).await;
        assert_eq!(run.state, RunState::Completed as i32, "{cmd:?}: {run:#?}");
        let passed = run
            .forks
            .iter()
            .filter(|f| f.verify == VerifyStatus::Passed as i32);
        assert!(
            passed.count() > 0,
            "{cmd:?}: cargo test passed in no fork: {run:#?}"
        );
        assert!(run.winner > 0, "{cmd:?}: {run:#?}");
    }
    if let Some(file) = cmd.iter().skip_while(|w| *w != "--save").nth(1) {
        let patch = std::fs::read_to_string(Path::new(&got.dir).join(file)).unwrap_or_default();
        assert!(
            patch.contains("diff --git"),
            "{cmd:?}: {file}: {patch}\n{}",
            got.out
        );
    }
    if has("get-contexts") {
        assert!(got.out.contains("prod"), "{cmd:?}: {}", got.out);
    }
    if has("--jq") {
        assert!(
            got.out.contains("run-"),
            "{cmd:?}: no completed run listed: {}",
            got.out
        );
    }
    if has("yaml") {
        assert!(got.out.contains("runId: run-"), "{cmd:?}: {}", got.out);
    }
}

/// `forkyard apply` put the winner's change (`agent.sh` appends the prompt of `task.md`)
/// into the checkout.
fn applied_to_the_checkout(dir: &Path) {
    let notes = std::fs::read_to_string(dir.join("NOTES.md")).unwrap_or_default();
    assert!(notes.contains("fix the flaky test"), "NOTES.md: {notes:?}");
}
