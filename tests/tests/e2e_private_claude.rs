//! End to end, the main job: the real `claude` CLI (Claude Code) in every fork of
//! a run on a private repository, over HTTPS-style basic auth (git's `http-backend`
//! behind lighttpd) and over SSH with a deploy key (sshd), against the scripted model
//! server through the metering LLM gateway; the winner comes back as a branch of that
//! repository (pushed over the same transport) with its commit. The git token is in no sandbox:
//! not in the agent's environment (which the model's tool call writes into the patch),
//! not in the workspace's git configuration, not in the branch's commit.

mod agent_cli;

use agent_cli::{
    model_mesh::{assert_cli_installed, launch, options},
    secrets::edit_and_scan,
};
use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{
        Delivery, LaunchRunRequest, RunState,
        delivery::{PullRequests, Push},
    },
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, GitSsh, git_env, git_in},
    repo,
    scripted_model::{Script, ScriptedModel},
    support::{Gateway, fork_result, run_to_end},
};
use std::time::Duration;

const TOKEN: &str = "ghp_privateClaudeE2eToken0042";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_forks_a_private_repository_and_its_winner_is_pushed() {
    assert_cli_installed("claude");
    let line = "edited by claude on a private repository";
    let model = ScriptedModel::start(Script::edit(&edit_and_scan(line))).await;
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    std::fs::write(src.path().join("notes.txt"), "notes\n").unwrap();
    repo::commit_all(src.path(), "notes").unwrap();
    let http = GitHttp::serve(src.path(), "forkyard", TOKEN);
    let ssh = GitSsh::serve(src.path());
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("git-credentials.toml");
    let entry = format!(
        "[[credential]]\nhost = \"127.0.0.1:{}\"\ntenants = [\"*\"]\nusername = \"forkyard\"\ntoken = \"{TOKEN}\"\n\n[[credential]]\nhost = \"127.0.0.1:{}\"\ntenants = [\"*\"]\nssh_key_file = \"{}\"\nknown_hosts_file = \"{}\"\n",
        http.port,
        ssh.port,
        ssh.key().display(),
        ssh.known_hosts().display()
    );
    std::fs::write(&creds, entry).unwrap();
    let mut opts = options(&model);
    let hosts = format!("127.0.0.1:{},127.0.0.1:{}", http.port, ssh.port);
    opts.service_env.extend(git_env(&hosts, &creds));
    let mesh = Mesh::start_with(opts).await.expect("mesh");
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    claude_run(&mut gw, &http.url(), &http.repo(), "claude-private", line).await;
    claude_run(&mut gw, &ssh.url(), &ssh.repo(), "claude-private-ssh", line).await;
}

/// Two Claude Code forks on `url` (served from the bare `repo_dir`), the winner pushed.
async fn claude_run(gw: &mut Gateway, url: &str, repo_dir: &std::path::Path, id: &str, line: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut req = LaunchRunRequest {
        request_id: id.into(),
        verify_command: format!("grep -qx '{line}' notes.txt"),
        delivery: Some(Delivery {
            push: Push::Winner as i32,
            pull_requests: PullRequests::None as i32,
            ..Default::default()
        }),
        ..launch(dir.path(), "claude-code", "sonnet", 2, "1")
    };
    req.repo = url.to_owned();
    let (run_id, run) = run_to_end(gw, req, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    assert!(run.winner > 0, "{run:#?}");

    for n in 1..=2 {
        let fork = fork_result(gw, &run_id, n).await;
        assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
        assert!(fork.patch.contains(&format!("+{line}")), "{}", fork.patch);
        // What the sandbox held, as the model's tool call wrote it into the patch.
        assert!(fork.patch.contains(".sandbox-env.txt"), "{}", fork.patch);
        assert!(
            !fork.patch.contains(TOKEN),
            "the git token reached fork {n}'s sandbox"
        );
        let delivered = fork.delivered.clone();
        if n == run.winner {
            let d = delivered.expect("the winner delivered");
            assert_eq!(d.error, "", "{d:#?}");
            let branch = format!("refs/heads/forkyard-fork-{n}");
            assert_eq!(git_in(repo_dir, &["rev-parse", &branch]), d.commit);
            let notes = git_in(repo_dir, &["show", &format!("{}:notes.txt", d.commit)]);
            assert!(notes.ends_with(line), "{notes}");
            let pushed = git_in(repo_dir, &["log", "-1", "-p", "--format=%B", &d.commit]);
            assert!(!pushed.contains(TOKEN), "the pushed commit holds the token");
        } else {
            assert!(delivered.is_none(), "only the winner: {delivered:?}");
        }
    }
}
