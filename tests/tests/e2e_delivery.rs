//! End to end: results out. A tenant's run on a private repository (git's
//! `http-backend` behind lighttpd, basic auth) delivers its forks as branches of that
//! repository: each a commit of the fork's change on its base, authored as the run
//! said, all pushed at the run's end from the mesh's side with the tenant's token; the
//! fork results say which branch and commit. A second run whose branches already
//! exist never forces over them: those forks say so and the run completes. Options
//! that make no sense are refused naming the field.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::{
    common::v1::ForkStatus,
    gateway::v1::{
        Delivery, GetForkResultRequest, LaunchRunRequest, PublishForkRequest, RunState,
        delivery::{PullRequests, Push},
    },
};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, git_in, git_mesh},
    repo,
    token_scan::{assert_not_kept, spellings},
};
use std::{path::Path, process::Command};
use tenant_calls::{Gw, launch_req, new_key, run_as, with_key};
use tonic::Code;

const AGENT: &str = r#"echo "fork $FORKYARD_FORK was here" > "fork-$FORKYARD_FORK.txt"
printf '{"total_cost_usd": 0.001}\n'"#;
const TOKEN: &str = "glpat-delivery-test-token";

async fn mesh(http: &GitHttp, dir: &Path) -> Mesh {
    mesh_with(dir, &[http.port], &[http.port]).await
}

/// A mesh whose git hosts are `127.0.0.1:<allowed>`, team A holding a token for each
/// of `credentials`.
async fn mesh_with(dir: &Path, credentials: &[u16], allowed: &[u16]) -> Mesh {
    let creds = dir.join("git-credentials.toml");
    let text: String = credentials
        .iter()
        .map(|port| {
            format!(
                "[[credential]]\nhost = \"127.0.0.1:{port}\"\ntenants = [\"team-a\"]\nusername = \"forkyard\"\ntoken = \"{TOKEN}\"\n"
            )
        })
        .collect();
    std::fs::write(&creds, text).unwrap();
    let hosts: Vec<String> = allowed.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    git_mesh(&hosts.join(","), &creds, Vec::new()).await
}

fn delivering(url: &str, id: &str, forks: u32, delivery: Delivery) -> LaunchRunRequest {
    let mut req = launch_req(Path::new("/unused"), id, AGENT);
    req.repo = url.to_owned();
    req.forks = forks;
    req.max_concurrent = forks;
    req.delivery = Some(delivery);
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn succeeded_forks_are_pushed_as_branches_once_and_never_forced_over() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve(src.path(), "forkyard", TOKEN);
    let base = git_in(&http.repo(), &["rev-parse", "HEAD"]);
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh(&http, dir.path()).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, key) = new_key(&mesh, "team-a");

    let push_all = Delivery {
        push: Push::Succeeded as i32,
        author_name: "Robo Author".into(),
        author_email: "robo@example.com".into(),
        ..Default::default()
    };
    let (run1, forks) = run_as(
        &mut gw,
        &key,
        delivering(&http.url(), "push-1", 3, push_all.clone()),
    )
    .await;
    assert_eq!(run1.state, RunState::Completed as i32, "{run1:#?}");
    for f in &forks {
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        let d = f
            .delivered
            .as_ref()
            .unwrap_or_else(|| panic!("fork {} not delivered: {f:#?}", f.fork));
        assert_eq!(d.error, "", "{d:#?}");
        let branch = format!("forkyard-fork-{}", f.fork);
        assert_eq!(d.branch, branch);
        assert_eq!(d.remote, http.url());
        // On the server: the branch at the commit the result names, whose parent is
        // the base, whose change is the fork's, authored as the run said.
        assert_eq!(
            git_in(
                &http.repo(),
                &["rev-parse", &format!("refs/heads/{branch}")]
            ),
            d.commit
        );
        assert_eq!(
            git_in(&http.repo(), &["rev-parse", &format!("{}^", d.commit)]),
            base
        );
        let file = format!("fork-{}.txt", f.fork);
        let shown = git_in(&http.repo(), &["show", &format!("{}:{file}", d.commit)]);
        assert_eq!(shown, format!("fork {} was here", f.fork));
        let who = git_in(
            &http.repo(),
            &["log", "-1", "--format=%an <%ae>|%cn|%s|%b", &d.commit],
        );
        assert!(
            who.starts_with("Robo Author <robo@example.com>|Robo Author|make it better|"),
            "{who}"
        );
        assert!(
            who.contains(&format!("Forkyard-Run: {}", run1.run_id)),
            "{who}"
        );
    }
    // The run's own view says the same.
    assert!(
        run1.forks
            .iter()
            .all(|f| f.delivered.as_ref().is_some_and(|d| !d.commit.is_empty()))
    );

    // Again, onto the same branches: someone's work (the first run's) is never forced
    // over; the forks say so, the run completes, the branches stay where they were.
    let before = git_in(
        &http.repo(),
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    );
    let (run2, forks) = run_as(
        &mut gw,
        &key,
        delivering(&http.url(), "push-2", 2, push_all),
    )
    .await;
    assert_eq!(run2.state, RunState::Completed as i32, "{run2:#?}");
    for f in &forks {
        let d = f.delivered.as_ref().expect("delivered");
        assert!(d.error.contains("not forced over"), "{d:#?}");
        assert_eq!(d.commit, "");
    }
    assert_eq!(
        git_in(
            &http.repo(),
            &["for-each-ref", "--format=%(refname) %(objectname)"]
        ),
        before
    );

    // The CLI: `--push winner --wait` shows where the winner went.
    let out = Command::new(forkyard_tests::mesh::bin_dir().join("forkyard"))
        .env("FORKYARD_GATEWAY", mesh.endpoint("gateway"))
        .env("FORKYARD_API_KEY", &key)
        .args([
            "fork",
            &http.url(),
            "-p",
            "add a file",
            "-f",
            "2",
            "--branch",
            "cli",
        ])
        .args([
            "--agent-command",
            AGENT,
            "--push",
            "winner",
            "--author",
            "Cli User <cli@example.com>",
        ])
        .args(["--request-id", "cli-push", "--wait"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let winner = git_in(
        &http.repo(),
        &["rev-parse", "--short=12", "refs/heads/cli-fork-1"],
    );
    assert!(
        stdout.contains(&format!("pushed cli-fork-1 @ {winner}")),
        "{stdout}"
    );
    let pushed = git_in(
        &http.repo(),
        &["for-each-ref", "--format=%(refname)", "refs/heads/cli-*"],
    );
    assert_eq!(pushed, "refs/heads/cli-fork-1", "the winner alone");

    // Delivered later: a run that pushed nothing, then a person picks fork 2.
    let (quiet, _) = run_as(&mut gw, &key, {
        let mut req = delivering(&http.url(), "later", 2, Delivery::default());
        req.delivery = None;
        req.branch = "later".into();
        req
    })
    .await;
    assert_eq!(quiet.state, RunState::Completed as i32);
    assert_eq!(
        git_in(&http.repo(), &["for-each-ref", "refs/heads/later-*"]),
        "",
        "nothing pushed yet"
    );
    let publish = |fork| PublishForkRequest {
        run_id: quiet.run_id.clone(),
        fork,
        ..Default::default()
    };
    let first = gw
        .publish_fork(with_key(&key, publish(2)))
        .await
        .expect("publish")
        .into_inner();
    let d = first.delivered.clone().expect("delivered");
    assert_eq!(
        (d.branch.as_str(), d.error.as_str()),
        ("later-fork-2", ""),
        "{d:#?}"
    );
    assert_eq!(
        git_in(&http.repo(), &["rev-parse", "refs/heads/later-fork-2"]),
        d.commit
    );
    // Once: asked again, the same answer, nothing new on the server.
    let again = gw
        .publish_fork(with_key(&key, publish(2)))
        .await
        .expect("again")
        .into_inner();
    assert_eq!(again.delivered, first.delivered);
    let refs = git_in(
        &http.repo(),
        &["for-each-ref", "--format=%(refname)", "refs/heads/later-*"],
    );
    assert_eq!(refs, "refs/heads/later-fork-2");
    // GetForkResult shows where it went.
    let asked = with_key(
        &key,
        GetForkResultRequest {
            run_id: quiet.run_id.clone(),
            fork: 2,
        },
    );
    let shown = gw.get_fork_result(asked).await.unwrap().into_inner();
    assert_eq!(shown.delivered, first.delivered);
    let err = gw
        .publish_fork(with_key(&key, publish(3)))
        .await
        .expect_err("no fork 3");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // Nonsense is refused, naming the field, before anything starts.
    let cases = [
        (
            Delivery {
                pull_requests: PullRequests::Winner as i32,
                ..Default::default()
            },
            "delivery.pull_requests",
        ),
        (
            Delivery {
                push: Push::Verified as i32,
                ..Default::default()
            },
            "delivery.push",
        ),
        (
            Delivery {
                push: Push::Winner as i32,
                author_email: "a>\nb".into(),
                ..Default::default()
            },
            "delivery.author_email",
        ),
        (
            Delivery {
                push: 99,
                ..Default::default()
            },
            "delivery.push",
        ),
    ];
    for (i, (d, named)) in cases.into_iter().enumerate() {
        let req = delivering(&http.url(), &format!("bad-{i}"), 1, d);
        let err = gw
            .launch_run(with_key(&key, req))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().starts_with(named),
            "{named}: {}",
            err.message()
        );
    }
    let mut local = delivering(
        &http.url(),
        "bad-local",
        1,
        Delivery {
            push: Push::Winner as i32,
            ..Default::default()
        },
    );
    local.repo = src.path().display().to_string();
    let err = gw
        .launch_run(with_key(&key, local))
        .await
        .expect_err("refused");
    assert!(
        err.message().starts_with("delivery.push"),
        "{}",
        err.message()
    );

    // The token pushed every branch, and is in no log or Temporal history of the runs.
    let secrets = spellings("forkyard", TOKEN);
    for (run, forks) in [(&run1.run_id, 3), (&run2.run_id, 2), (&quiet.run_id, 2)] {
        assert_not_kept(&mesh, run, forks, &http.url(), &secrets);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_go_to_another_allowed_remote_and_deliveries_that_cannot_be_made_are_refused() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let http = GitHttp::serve(src.path(), "forkyard", TOKEN);
    let mirror = GitHttp::serve(src.path(), "forkyard", TOKEN);
    let (no_creds, unlisted) = (9, 7);
    let dir = tempfile::tempdir().unwrap();
    let mesh = mesh_with(
        dir.path(),
        &[http.port, mirror.port],
        &[http.port, mirror.port, no_creds],
    )
    .await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, key) = new_key(&mesh, "team-a");

    let to = |remote: String, prs: PullRequests| Delivery {
        push: Push::Succeeded as i32,
        pull_requests: prs as i32,
        remote,
        ..Default::default()
    };
    let req = delivering(
        &http.url(),
        "mirrored",
        2,
        to(mirror.url(), PullRequests::None),
    );
    let (done, forks) = run_as(&mut gw, &key, req).await;
    assert_eq!(done.state, RunState::Completed as i32, "{done:#?}");
    for f in &forks {
        let d = f.delivered.clone().expect("delivered");
        assert_eq!(
            (d.remote.as_str(), d.error.as_str()),
            (mirror.url().as_str(), ""),
            "{d:#?}"
        );
        let on_mirror = git_in(
            &mirror.repo(),
            &["rev-parse", &format!("refs/heads/forkyard-fork-{}", f.fork)],
        );
        assert_eq!(on_mirror, d.commit);
    }
    assert_eq!(
        git_in(&http.repo(), &["for-each-ref", "refs/heads/forkyard-*"]),
        "",
        "the source untouched"
    );

    // Refused at launch, nothing started.
    let elsewhere = |port: u16| format!("http://127.0.0.1:{port}/git/r.git");
    let cases = [
        (
            to(elsewhere(unlisted), PullRequests::None),
            Code::InvalidArgument,
            "delivery.remote: 127.0.0.1 is not a git host",
        ),
        (
            to(elsewhere(no_creds), PullRequests::None),
            Code::FailedPrecondition,
            "delivery.push: tenant team-a has no git credentials for 127.0.0.1",
        ),
        (
            to(
                mirror.url().replace("http://", "http://u:secret@"),
                PullRequests::None,
            ),
            Code::InvalidArgument,
            "delivery.remote: must not carry credentials",
        ),
        (
            to(mirror.url(), PullRequests::Winner),
            Code::InvalidArgument,
            "delivery.pull_requests: pull requests are opened on the run's own repository",
        ),
        (
            to(String::new(), PullRequests::Winner),
            Code::FailedPrecondition,
            "delivery.pull_requests: no forge api for 127.0.0.1",
        ),
    ];
    for (i, (d, code, says)) in cases.into_iter().enumerate() {
        let req = delivering(&http.url(), &format!("refused-{i}"), 1, d);
        let err = gw
            .launch_run(with_key(&key, req))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), code, "{err:?}");
        assert!(err.message().starts_with(says), "{says}: {}", err.message());
        assert!(!err.message().contains("secret"), "{}", err.message());
    }
}
