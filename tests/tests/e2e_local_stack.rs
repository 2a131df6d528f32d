//! The local stack as a newcomer meets it (`make up`, `scripts/up.sh`): started once and
//! its demo run (`make demo`), then `ANTHROPIC_API_KEY=… make up` again restarts the
//! agent runner with the key (and nothing else), so a Claude Code fork then runs (through
//! the scripted model server); a third `make up` with the same settings restarts nothing;
//! `make down` leaves no service behind. It runs the stack on its default ports
//! (50051–50055, Temporal 7233): a stack of your own running there makes this test fail,
//! saying so.

use forkyard_proto::{
    common::v1::{AgentSpec, ForkStatus},
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    local_stack::{Down, assert_ports_closed, assert_ports_free, environ, pid, script},
    repo,
    scripted_model::{Script, ScriptedModel},
    support::run_to_end,
};
use std::{path::Path, time::Duration};

const KEY: &str = "sk-ant-api03-local-stack-test-key";

/// The stack's databases (Temporal's, the ledger's, the keys'), logs, pid files and
/// artifacts are its user's alone: no file of them, and no directory holding them, lets
/// the group or others in (the state directory itself is searchable only, so that
/// sandboxes of uids of their own can pass it).
fn owner_only(state: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode(state) & 0o066,
        0,
        "{}: {:o}",
        state.display(),
        mode(state)
    );
    let mut checked = 0;
    for dir in ["", "logs", "pids", "artifacts"] {
        let dir = state.join(dir);
        if !dir.is_dir() {
            continue;
        }
        if dir != state {
            assert_eq!(mode(&dir) & 0o077, 0, "{}: {:o}", dir.display(), mode(&dir));
        }
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_file() {
                assert_eq!(
                    mode(&path) & 0o077,
                    0,
                    "{}: {:o}",
                    path.display(),
                    mode(&path)
                );
                checked += 1;
            }
        }
    }
    assert!(
        ["temporal.db", "ledger.db", "logs/gateway.log"]
            .iter()
            .all(|f| state.join(f).is_file()),
        "the stack's files are not where this test looks: {checked} checked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_up_again_with_a_model_key_restarts_the_runner_with_it_and_nothing_else() {
    assert_ports_free();
    let state = tempfile::tempdir().unwrap();
    let _down = Down(state.path());
    let model = ScriptedModel::start(Script::edit("echo claude >> notes.txt")).await;
    let url = model.url.clone();

    let first = script("up.sh", state.path(), &[]);
    assert!(first.contains("starting agent-runner"), "{first}");
    let (gateway, runner) = (
        pid(state.path(), "gateway"),
        pid(state.path(), "agent-runner"),
    );
    assert!(!environ(runner).contains("ANTHROPIC_API_KEY="));
    owner_only(state.path());
    // `make demo` is `make up` and then its run: three forks, every one succeeded (the
    // script exits with the CLI's code).
    let demo = script("demo.sh", state.path(), &[]);
    assert!(demo.contains("launching 3 forks"), "{demo}");

    let with_key = [
        ("ANTHROPIC_API_KEY", KEY),
        ("ANTHROPIC_BASE_URL", url.as_str()),
    ];
    let second = script("up.sh", state.path(), &with_key);
    assert!(
        second.contains("restarting agent-runner: started with other settings (ANTHROPIC_API_KEY ANTHROPIC_BASE_URL )"),
        "{second}"
    );
    assert!(!second.contains(KEY), "the key is never printed: {second}");
    assert!(!second.contains("restarting gateway"), "{second}");
    let runner_now = pid(state.path(), "agent-runner");
    assert_ne!(runner_now, runner, "the runner was restarted");
    assert_eq!(pid(state.path(), "gateway"), gateway, "the gateway was not");
    assert!(environ(runner_now).contains(&format!("ANTHROPIC_API_KEY={KEY}")));
    assert!(
        !environ(gateway).contains(KEY),
        "the model key goes to the runner alone"
    );
    let settings =
        std::fs::read_to_string(state.path().join("pids/agent-runner.settings")).unwrap();
    assert!(
        settings.contains("ANTHROPIC_API_KEY ") && !settings.contains(KEY),
        "{settings}"
    );

    // The same settings again: nothing restarts.
    let third = script("up.sh", state.path(), &with_key);
    assert!(!third.contains("restarting"), "{third}");
    assert_eq!(pid(state.path(), "agent-runner"), runner_now);

    // And a Claude Code fork runs.
    let dir = tempfile::tempdir().unwrap();
    repo::create(dir.path()).unwrap();
    let mut gw = GatewayClient::connect("http://127.0.0.1:50051")
        .await
        .unwrap();
    let req = LaunchRunRequest {
        repo: dir.path().display().to_string(),
        prompt: "add a line to notes.txt".into(),
        forks: 1,
        max_concurrent: 1,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: "claude-code".into(),
            model: "sonnet".into(),
            ..Default::default()
        }),
        fork_timeout_secs: 180,
        ..Default::default()
    };
    let (_, run) = run_to_end(&mut gw, req, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert_eq!(run.forks[0].status, ForkStatus::Succeeded as i32);

    let down = script("down.sh", state.path(), &[]);
    assert!(down.contains("stopped agent-runner"), "{down}");
    assert_ports_closed();
}
