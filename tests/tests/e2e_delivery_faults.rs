//! End to end: delivery exactly once. The gateway dies (a fault point, as `kill -9`)
//! right after a run's branches were pushed, and again right after their pull requests
//! were opened (on a fake forge speaking GitHub's REST API); another gateway finishes
//! the delivery: one branch per fork on the git server, one pull request per fork on the
//! forge, and the forks' results name them. A forge that keeps failing is reported on
//! the forks; the run completes with its branches pushed.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_common::fake_forge::FakeForge;
use forkyard_proto::{
    common::v1::ForkResult,
    gateway::v1::{
        Delivery, GetForkResultRequest, RunState,
        delivery::{PullRequests, Push},
    },
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, git_in, git_mesh, github_credentials},
    repo,
    token_scan::{assert_absent, assert_not_kept, spellings},
};
use std::{path::Path, time::Duration};
use tenant_calls::{Gw, launch_req, new_key, wait_closed, with_key};

const AGENT: &str = r#"echo "fork $FORKYARD_FORK" > "fork-$FORKYARD_FORK.txt"
printf '{"total_cost_usd": 0.001}\n'"#;
const TOKEN: &str = "ghp_delivery_faults_token";

async fn mesh(http: &GitHttp, forge: &FakeForge, dir: &Path, faults: Option<&str>) -> Mesh {
    let creds = github_credentials(dir, http, "forkyard", TOKEN, forge.github_api());
    let hosts = format!("127.0.0.1:{}", http.port);
    let faults = faults.map(|point| ("gateway".into(), "FORKYARD_FAULTS".into(), point.into()));
    git_mesh(&hosts, &creds, faults.into_iter().collect()).await
}

async fn forks(gw: &mut Gw, key: &str, run_id: &str, n: u32) -> Vec<ForkResult> {
    let mut out = Vec::new();
    for fork in 1..=n {
        let asked = with_key(
            key,
            GetForkResultRequest {
                run_id: run_id.into(),
                fork,
            },
        );
        out.push(gw.get_fork_result(asked).await.expect("fork").into_inner());
    }
    out
}

fn each_pr(id: &str, url: &str) -> forkyard_proto::gateway::v1::LaunchRunRequest {
    let mut req = launch_req(Path::new("/unused"), id, AGENT);
    req.repo = url.to_owned();
    req.forks = 2;
    req.max_concurrent = 2;
    req.delivery = Some(Delivery {
        push: Push::Succeeded as i32,
        pull_requests: PullRequests::Each as i32,
        draft: true,
        ..Default::default()
    });
    req
}

async fn killed_at(point: &str) {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve(src.path(), "forkyard", TOKEN);
    let forge = FakeForge::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let mut mesh = mesh(&http, &forge, dir.path(), Some(point)).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, key) = new_key(&mesh, "team-a");
    let req = each_pr(&format!("fault-{point}"), &http.url());
    let run_id = gw
        .launch_run(with_key(&key, req))
        .await
        .unwrap()
        .into_inner()
        .run_id;

    let died = tokio::task::block_in_place(|| mesh.wait_exit("gateway", Duration::from_secs(120)));
    assert!(
        died.is_some_and(|s| !s.success()),
        "{point}: the gateway did not die: {died:?}"
    );
    assert!(mesh.log_tail("gateway").contains(point), "{point}");
    mesh.set_service_env("gateway", "FORKYARD_FAULTS", None);
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .unwrap();
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let run = wait_closed(&mut gw, &key, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{point}: {run:#?}");

    let default = git_in(&http.repo(), &["symbolic-ref", "--short", "HEAD"]);
    let pulls = forge.pulls();
    assert_eq!(
        pulls.len(),
        2,
        "{point}: one pull request per fork: {pulls:#?}"
    );
    for f in forks(&mut gw, &key, &run_id, 2).await {
        let d = f.delivered.clone().expect("delivered");
        assert_eq!(d.error, "", "{point}: {d:#?}");
        let branch = format!("forkyard-fork-{}", f.fork);
        assert_eq!(
            git_in(
                &http.repo(),
                &["rev-parse", &format!("refs/heads/{branch}")]
            ),
            d.commit
        );
        let pr = pulls
            .iter()
            .find(|p| p.head == branch)
            .expect("its pull request");
        assert_eq!(
            (pr.repo.as_str(), pr.base.as_str(), pr.draft),
            ("git/r", default.as_str(), true)
        );
        assert!(
            d.pull_request_url
                .ends_with(&format!("/pull/{}", pr.number)),
            "{d:#?}"
        );
        assert!(
            pr.body
                .contains(&format!("Fork **{}** of Forkyard run `{run_id}`", f.fork)),
            "{}",
            pr.body
        );
        assert!(pr.body.contains("| rank | fork |"), "{}", pr.body);
    }
    let refs = git_in(
        &http.repo(),
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/heads/forkyard-*",
        ],
    );
    assert_eq!(refs.lines().count(), 2, "{refs}");
    // The token pushed and opened them, and is in no log, history or pull request.
    let secrets = spellings("forkyard", TOKEN);
    assert_not_kept(&mesh, &run_id, 2, &http.url(), &secrets);
    assert_absent("a pull request", &format!("{pulls:?}"), &secrets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_the_push_delivers_once() {
    killed_at("deliver.after-push").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_the_pull_requests_delivers_once() {
    killed_at("deliver.after-pr").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forge_that_keeps_failing_is_reported_on_the_forks_and_the_run_completes() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve(src.path(), "forkyard", TOKEN);
    let forge = FakeForge::start(TOKEN).await;
    forge.fail_next(1000);
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh(&http, &forge, dir.path(), None).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, key) = new_key(&mesh, "team-a");
    let req = each_pr("forge-down", &http.url());
    let run_id = gw
        .launch_run(with_key(&key, req))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let run = wait_closed(&mut gw, &key, &run_id, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    for f in forks(&mut gw, &key, &run_id, 2).await {
        let d = f.delivered.clone().expect("delivered");
        assert!(!d.commit.is_empty(), "pushed all the same: {d:#?}");
        assert!(
            d.error.starts_with("pull request: ") && d.error.contains("502"),
            "{d:#?}"
        );
        assert_eq!(d.pull_request_url, "");
    }
    // Tried more than once each (the forge may answer later), then given up on.
    let tries = forge.seen().iter().filter(|s| s.method == "POST").count();
    assert!(tries >= 4, "{tries} tries");
    assert!(forge.pulls().is_empty());
}
