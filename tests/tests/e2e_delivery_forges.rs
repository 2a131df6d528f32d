//! End to end: a run's repository read and its forks delivered with each kind of forge
//! credential the issue names, against real git servers (git's `http-backend` behind
//! lighttpd) and the fake forge speaking GitHub's and GitLab's REST APIs.
//!
//! - A GitHub App (app id and private key): the mesh signs a JWT, exchanges it for an
//!   installation token scoped to the run's repository alone, clones, pushes the winner
//!   and opens its pull request with it. The git server takes only the tokens the forge
//!   minted (as github.com does). Neither the minted tokens nor the app's key are in any
//!   sandbox while its agent runs, in a log, a history or a result.
//! - A GitLab token: every pushed fork gets a draft merge request; the server's own
//!   `update` hook refuses one fork's branch (a protected branch, as a forge's hook
//!   declines it): that fork says so and gets no merge request, the others are
//!   delivered, the run completes.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use base64::Engine as _;
use forkyard_common::fake_forge::{FakeForge, generate_app_key};
use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{
        Delivery, LaunchRunRequest, RunState,
        delivery::{PullRequests, Push},
    },
};
use forkyard_tests::{
    git_server::{GitHttp, git_in, git_mesh},
    repo,
    token_scan::{assert_absent, assert_not_kept, assert_sandbox_clean, sandbox_scan, spellings},
};
use std::{path::Path, sync::Arc};
use tenant_calls::{Gw, launch_req, new_key, run_as};

const APP_ID: &str = "31337";
const INSTALLATION: u64 = 9;
/// How the fake forge's installation tokens begin (`ghs_fake0001x…`).
const MINTED_PREFIX: &str = "ghs_fake0";

fn delivering(url: &str, id: &str, agent: &str, forks: u32, d: Delivery) -> LaunchRunRequest {
    let mut req = launch_req(Path::new("/unused"), id, agent);
    (req.repo, req.forks, req.max_concurrent) = (url.to_owned(), forks, forks);
    req.delivery = Some(d);
    req
}

/// Fork n writes a file of its own and costs n tenths of a cent (fork 1 wins), after
/// `scan` (a [`sandbox_scan`], or nothing).
fn agent(scan: &str) -> String {
    format!(
        "{scan}\necho \"fork $FORKYARD_FORK\" > \"fork-$FORKYARD_FORK.txt\"\n\
         printf '{{\"total_cost_usd\": 0.00%s}}\\n' \"$FORKYARD_FORK\""
    )
}

/// What of a GitHub App's secrets a sandbox could hold, known before any is minted: the
/// installation tokens' prefix, alone and as git's basic authentication spells it, and
/// a line of the app's private key.
fn app_secrets(key_file: &Path) -> Vec<String> {
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{MINTED_PREFIX}"));
    let pem = std::fs::read_to_string(key_file).unwrap();
    let key_line = pem.lines().nth(3).unwrap().to_owned();
    vec![MINTED_PREFIX.to_owned(), basic, key_line]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_app_reads_pushes_and_opens_the_pull_request_with_tokens_for_the_repository() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    // The server takes nothing until the forge mints a token: then that one.
    let http = Arc::new(GitHttp::serve_tokens(src.path()));
    let forge = FakeForge::start("not-the-apps-token").await;
    let dir = tempfile::tempdir().unwrap();
    let key = generate_app_key(dir.path(), "app", true);
    forge.add_app(APP_ID, &key.public_pem, INSTALLATION);
    let server = http.clone();
    forge.on_mint(move |m| server.allow("x-access-token", &m.token));
    let creds = dir.path().join("git-credentials.toml");
    std::fs::write(
        &creds,
        format!(
            "[[credential]]\nhost = \"127.0.0.1:{}\"\ntenants = [\"team-a\"]\napp_id = {APP_ID}\napp_key_file = \"{}\"\ninstallation_id = {INSTALLATION}\napi = \"{}\"\n",
            http.port,
            key.key_file.display(),
            forge.github_api()
        ),
    )
    .unwrap();
    let mesh = git_mesh(&format!("127.0.0.1:{}", http.port), &creds, Vec::new()).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, api_key) = new_key(&mesh, "team-a");

    let winner_pr = Delivery {
        push: Push::Winner as i32,
        pull_requests: PullRequests::Winner as i32,
        branch_prefix: "app".into(),
        ..Default::default()
    };
    let agent = agent(&sandbox_scan(&app_secrets(&key.key_file)));
    let req = delivering(&http.url(), "app-1", &agent, 2, winner_pr);
    let (run, forks) = run_as(&mut gw, &api_key, req).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    for f in &forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        assert_sandbox_clean(f.fork, &f.patch);
    }

    // The winner's branch on the server, its pull request on the forge, as the result says.
    let branch = git_in(&http.repo(), &["for-each-ref", "--format=%(refname:short)"]);
    assert!(branch.lines().eq(["app-fork-1", "main"]), "{branch}");
    let delivered = forks[0].delivered.clone().expect("the winner delivered");
    assert_eq!(delivered.error, "");
    assert_eq!(
        delivered.commit,
        git_in(&http.repo(), &["rev-parse", "refs/heads/app-fork-1"])
    );
    let pulls = forge.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(
        (pulls[0].repo.as_str(), pulls[0].head.as_str()),
        ("git/r", "app-fork-1")
    );
    assert_eq!(
        delivered.pull_request_url,
        format!("{}/git/r/pull/1", forge.url())
    );

    // Every token was an installation token for this repository alone, minted once by
    // each service that reads it (the gateway: check, push, pull request; the
    // provisioner: the clone), and the pull request went with one.
    let minted = forge.minted();
    assert_eq!(minted.len(), 2, "{minted:#?}");
    for m in &minted {
        assert_eq!(m.repositories, Some(vec!["r".to_owned()]), "{m:#?}");
        assert!(m.token.starts_with(MINTED_PREFIX), "{}", m.token);
    }
    let calls = forge.seen();
    let pr_call = calls
        .iter()
        .find(|s| s.path == "/repos/git/r/pulls" && s.method == "POST");
    assert!(pr_call.is_some_and(|c| c.authorized), "{calls:#?}");

    // Nowhere else: logs, histories, results, the forge's requests.
    let mut secrets: Vec<String> = minted
        .iter()
        .flat_map(|m| spellings("x-access-token", &m.token))
        .collect();
    secrets.extend(app_secrets(&key.key_file));
    assert_not_kept(&mesh, &run.run_id, 2, &http.url(), &secrets);
    assert_absent("the fork results", &format!("{forks:?}"), &secrets);
    let bodies: Vec<_> = calls.into_iter().filter_map(|s| s.body).collect();
    assert_absent("what the forge received", &format!("{bodies:?}"), &secrets);
}

/// A hook in the served repository that declines `refs/heads/<refused>`, as a forge's
/// protected-branch hook does: its message to the pusher, and the ref refused alone.
fn refuse_branch(repo: &Path, refused: &str) {
    let hook = repo.join("hooks/update");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = \"refs/heads/{refused}\" ]; then\n  echo \"GH006: Protected branch update failed for $1.\" >&2\n  exit 1\nfi\n"
    );
    std::fs::write(&hook, script).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_merge_requests_for_each_pushed_fork_and_a_branch_the_server_refuses() {
    const TOKEN: &str = "glpat-forges-test-token";
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve(src.path(), "oauth2", TOKEN);
    refuse_branch(&http.repo(), "mr-fork-2");
    let forge = FakeForge::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("git-credentials.toml");
    std::fs::write(
        &creds,
        format!(
            "[[credential]]\nhost = \"127.0.0.1:{}\"\ntenants = [\"team-a\"]\nusername = \"oauth2\"\ntoken = \"{TOKEN}\"\nforge = \"gitlab\"\napi = \"{}\"\n",
            http.port,
            forge.gitlab_api()
        ),
    )
    .unwrap();
    let mesh = git_mesh(&format!("127.0.0.1:{}", http.port), &creds, Vec::new()).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, api_key) = new_key(&mesh, "team-a");

    let each_draft = Delivery {
        push: Push::Succeeded as i32,
        pull_requests: PullRequests::Each as i32,
        draft: true,
        branch_prefix: "mr".into(),
        ..Default::default()
    };
    let req = delivering(&http.url(), "mr-1", &agent(""), 3, each_draft);
    let (run, forks) = run_as(&mut gw, &api_key, req).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let branches = git_in(&http.repo(), &["for-each-ref", "--format=%(refname:short)"]);
    assert!(
        branches.lines().eq(["main", "mr-fork-1", "mr-fork-3"]),
        "{branches}"
    );

    let requests = forge.pulls();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    for f in &forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        let d = f.delivered.clone().unwrap_or_default();
        if f.fork == 2 {
            // Refused by the server's hook, said on the fork; no commit, no merge request.
            assert!(
                d.commit.is_empty() && d.pull_request_url.is_empty(),
                "{d:#?}"
            );
            assert!(d.error.contains("hook declined"), "{d:#?}");
            continue;
        }
        let head = format!("mr-fork-{}", f.fork);
        let mr = requests
            .iter()
            .find(|r| r.head == head)
            .expect("its merge request");
        assert_eq!((mr.repo.as_str(), mr.base.as_str()), ("git/r", "main"));
        assert!(mr.draft && mr.title.starts_with("Draft: "), "{mr:#?}");
        assert_eq!(
            d.pull_request_url,
            format!("{}/git/r/-/merge_requests/{}", forge.url(), mr.number)
        );
        assert_eq!(d.error, "", "{d:#?}");
    }
    // GitLab's header carried the token on every call, and each was let in.
    let calls = forge.seen();
    assert!(
        calls
            .iter()
            .all(|s| s.authorized && s.auth_header == Some("private-token")),
        "{calls:#?}"
    );
    assert_not_kept(
        &mesh,
        &run.run_id,
        3,
        &http.url(),
        &spellings("oauth2", TOKEN),
    );
}
