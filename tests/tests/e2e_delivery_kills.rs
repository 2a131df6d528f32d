//! End to end: delivery exactly once through kills (`kill -9`) in the middle of it, at
//! moments the test holds open: a push waits in the git server's `pre-receive` hook
//! (its commits sent, its branches not yet updated; `forkyard_tests::push_gate`), and a
//! pull request waits for its answer on the fake GitHub (created there, its creator not
//! yet told; `FakeForge::hold_created`).
//!
//! The sandbox-provisioner dies during the push and again during a pull request: the
//! delivery, the gateway's own, goes on. The gateway dies during the push; its git
//! process, orphaned, lands the branches after the retry's push reached the server,
//! whose ref updates are then refused, and the retry still counts them pushed (they are
//! at its commits). The gateway dies again with a pull request created and unanswered.
//! Each run ends with one branch and one pull request per fork, named by the forks'
//! results, and the token in no log or history.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_common::fake_forge::FakeForge;
use forkyard_proto::gateway::v1::{
    Delivery, GetForkResultRequest, LaunchRunRequest, RunState,
    delivery::{PullRequests, Push},
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, git_in, git_mesh, github_credentials},
    push_gate::PushGate,
    repo,
    token_scan::{assert_absent, assert_not_kept, fresh_token, spellings},
};
use std::{
    path::Path,
    time::{Duration, Instant},
};
use tenant_calls::{Gw, launch_req, new_key, wait_closed, with_key};

const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
printf '{"total_cost_usd": 0.001}\n'"#;
const USER: &str = "forkyard";
/// Longer than the delivery activity's heartbeat timeout (30 s), after which a dead
/// gateway's attempt is retried, with room for the run.
const RETRIED: Duration = Duration::from_secs(120);

async fn mesh(http: &GitHttp, forge: &FakeForge, token: &str, dir: &Path) -> Mesh {
    let creds = github_credentials(dir, http, USER, token, forge.github_api());
    git_mesh(&format!("127.0.0.1:{}", http.port), &creds, Vec::new()).await
}

/// Two forks, each pushed as `<prefix>-fork-<n>` with a pull request.
fn each_pr(prefix: &str, url: &str) -> LaunchRunRequest {
    let mut req = launch_req(Path::new("/unused"), prefix, AGENT);
    req.repo = url.to_owned();
    req.forks = 2;
    req.max_concurrent = 2;
    req.delivery = Some(Delivery {
        push: Push::Succeeded as i32,
        pull_requests: PullRequests::Each as i32,
        branch_prefix: prefix.to_owned(),
        ..Default::default()
    });
    req
}

/// Wait until `done()`; panics after `timeout`, naming `what`.
async fn until(what: &str, timeout: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: never happened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILL `service` and start it again, serving.
async fn kill_and_restart(mesh: &mut Mesh, service: &str) {
    mesh.kill9(service);
    restart(mesh, service).await;
}

async fn restart(mesh: &mut Mesh, service: &str) {
    mesh.start_service(service).unwrap();
    mesh.wait_serving(service, Duration::from_secs(60))
        .await
        .unwrap();
}

/// The run completed with each of its two forks on one branch `<prefix>-fork-<n>` at the
/// commit its result names, and one pull request each, whose URL its result names.
async fn delivered_once(
    gw: &mut Gw,
    key: &str,
    run_id: &str,
    http: &GitHttp,
    forge: &FakeForge,
    prefix: &str,
) {
    let run = wait_closed(gw, key, run_id, RETRIED).await;
    assert_eq!(run.state, RunState::Completed as i32, "{prefix}: {run:#?}");
    let pattern = format!("refs/heads/{prefix}-*");
    let refs = git_in(
        &http.repo(),
        &["for-each-ref", "--format=%(refname:short)", &pattern],
    );
    assert_eq!(
        refs,
        format!("{prefix}-fork-1\n{prefix}-fork-2"),
        "{prefix}"
    );
    let pulls = forge.pulls();
    for fork in 1..=2 {
        let asked = GetForkResultRequest {
            run_id: run_id.into(),
            fork,
        };
        let f = gw
            .get_fork_result(with_key(key, asked))
            .await
            .expect("fork")
            .into_inner();
        let d = f.delivered.clone().unwrap_or_default();
        let branch = format!("{prefix}-fork-{fork}");
        assert_eq!(
            (d.branch.as_str(), d.error.as_str()),
            (branch.as_str(), ""),
            "{d:#?}"
        );
        let at = git_in(
            &http.repo(),
            &["rev-parse", &format!("refs/heads/{branch}")],
        );
        assert_eq!(d.commit, at, "{prefix}: fork {fork}");
        let mine: Vec<_> = pulls.iter().filter(|p| p.head == branch).collect();
        assert_eq!(
            mine.len(),
            1,
            "{prefix}: one pull request of {branch}: {pulls:#?}"
        );
        let url = format!("{}/{}/pull/{}", forge.url(), mine[0].repo, mine[0].number);
        assert_eq!(d.pull_request_url, url, "{prefix}: fork {fork}");
    }
}

/// What the two kills share: the git server and its gate, the forge, team A's key.
struct Parts<'a> {
    http: &'a GitHttp,
    gate: &'a PushGate,
    forge: &'a FakeForge,
    key: &'a str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_of_the_provisioner_and_the_gateway_mid_push_and_mid_pull_request_deliver_once() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let token = fresh_token();
    let http = GitHttp::serve(src.path(), USER, &token);
    let gate = PushGate::install(&http.repo());
    let forge = FakeForge::start(&token).await;
    let dir = tempfile::tempdir().unwrap();
    let mut mesh = mesh(&http, &forge, &token, dir.path()).await;
    let (_, key) = new_key(&mesh, "team-a");
    let parts = Parts {
        http: &http,
        gate: &gate,
        forge: &forge,
        key: &key,
    };

    let prov = provisioner_killed(&mut mesh, &parts).await;
    let gw = gateway_killed(&mut mesh, &parts).await;

    let secrets = spellings(USER, &token);
    for run in [&prov, &gw] {
        assert_not_kept(&mesh, run, 2, &http.url(), &secrets);
    }
    assert_absent("a pull request", &format!("{:?}", forge.pulls()), &secrets);
}

/// The provisioner dies during the push, and again during the first pull request: the
/// gateway's delivery goes on. The run's id.
async fn provisioner_killed(mesh: &mut Mesh, p: &Parts<'_>) -> String {
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    p.forge.hold_created(true);
    let req = with_key(p.key, each_pr("prov", &p.http.url()));
    let run_id = gw
        .launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    p.gate.wait_held(1, RETRIED, "the push").await;
    kill_and_restart(mesh, "sandbox-provisioner").await;
    p.gate.open();
    until("a pull request", RETRIED, || p.forge.held() >= 1).await;
    kill_and_restart(mesh, "sandbox-provisioner").await;
    p.forge.hold_created(false);
    delivered_once(&mut gw, p.key, &run_id, p.http, p.forge, "prov").await;
    run_id
}

/// The gateway dies during the push. Its git process, orphaned, lands the branches
/// after the retry's push reached the server (which then refuses the retry's ref
/// updates); the gateway dies again with a pull request created and unanswered. The
/// run's id.
async fn gateway_killed(mesh: &mut Mesh, p: &Parts<'_>) -> String {
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    p.gate.close();
    p.forge.hold_created(true);
    let held = (p.gate.held(), p.forge.held());
    let req = with_key(p.key, each_pr("gw", &p.http.url()));
    let run_id = gw
        .launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    p.gate.wait_held(held.0 + 1, RETRIED, "the push").await;
    kill_and_restart(mesh, "gateway").await;
    p.gate
        .wait_held(held.0 + 2, RETRIED, "the retry's push")
        .await;
    p.gate.open_first();
    let refs = || git_in(&p.http.repo(), &["for-each-ref", "refs/heads/gw-*"]);
    until("the orphaned push", RETRIED, || refs().lines().count() == 2).await;
    p.gate.open();
    until("a pull request", RETRIED, || p.forge.held() > held.1).await;
    mesh.kill9("gateway");
    p.forge.hold_created(false);
    restart(mesh, "gateway").await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    delivered_once(&mut gw, p.key, &run_id, p.http, p.forge, "gw").await;
    run_id
}
