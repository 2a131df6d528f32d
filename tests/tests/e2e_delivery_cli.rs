//! End to end, the command line: `forkyard fork <private url> … --push winner
//! --pr --wait` through the real CLI binary against a mesh holding a tenant's token for
//! a git server (git's `http-backend` behind lighttpd, basic auth) whose forge API is
//! the fake GitHub. The winner comes back as a branch, a commit and a pull request, as
//! printed; `forkyard publish <run> <fork> --pr` delivers another fork later, once
//! (`result` answers at once meanwhile), and `status`, `result` and GetRun show where
//! each went, from the gateway that published it and from one that kept nothing of the
//! run. `--push verified --pr` pushes every verified fork and opens one pull request,
//! the winner's.
//!
//! The token is looked for everywhere it must never be: inside every fork's sandbox
//! while its agent runs (the agent command scans, see `forkyard_tests::token_scan`),
//! then in the mesh's logs, the runs' Temporal histories, the fork results, what the
//! CLI printed and what the forge received.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_common::fake_forge::{FakeForge, Stored};
use forkyard_proto::gateway::v1::{GetForkResultRequest, Run, RunState};
use forkyard_tests::{
    Mesh,
    git_server::{GitHttp, git_in, git_mesh, github_credentials},
    mesh::bin_dir,
    repo,
    token_scan::{
        assert_absent, assert_not_kept, assert_sandbox_clean, fresh_token, sandbox_scan, spellings,
    },
};
use std::{path::Path, process::Command, time::Duration};
use tenant_calls::{Gw, get, new_key, with_key};

const USER: &str = "forkyard";

/// The scan, then the fork's change; fork 2 alone fails `--verify 'test -f verified'`.
/// Fork 1 is the cheapest, so the winner when it verifies.
fn agent(secrets: &[String]) -> String {
    format!(
        "{}\n[ \"$FORKYARD_FORK\" = 2 ] || touch verified\n\
         echo \"fork $FORKYARD_FORK\" > \"fork-$FORKYARD_FORK.txt\"\n\
         printf '{{\"total_cost_usd\": 0.00%s}}\\n' \"$FORKYARD_FORK\"",
        sandbox_scan(secrets)
    )
}

/// Team A's token for the git server, whose forge API is the fake GitHub.
async fn mesh(http: &GitHttp, forge: &FakeForge, token: &str, dir: &Path) -> Mesh {
    let creds = github_credentials(dir, http, USER, token, forge.github_api());
    git_mesh(&format!("127.0.0.1:{}", http.port), &creds, Vec::new()).await
}

/// The `forkyard` binary as team A, its config file none of the user's; everything it
/// printed is kept for the secret's search.
struct Cli {
    gateway: String,
    key: String,
    config: tempfile::TempDir,
    printed: String,
}

impl Cli {
    /// `forkyard args…` started, its output piped.
    fn spawn(&self, args: &[&str]) -> std::process::Child {
        Command::new(bin_dir().join("forkyard"))
            .args(args)
            .env("FORKYARD_CONFIG", self.config.path().join("config.toml"))
            .env("FORKYARD_GATEWAY", &self.gateway)
            .env("FORKYARD_API_KEY", &self.key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("forkyard runs")
    }

    /// `forkyard args…`: (exit code, stdout, stderr).
    fn run(&mut self, args: &[&str]) -> (Option<i32>, String, String) {
        let child = self.spawn(args);
        self.finish(child)
    }

    /// `forkyard args…`, which must end within `limit` (else it is killed, and the test
    /// fails: the command hung).
    fn run_within(&mut self, limit: Duration, args: &[&str]) -> (Option<i32>, String, String) {
        let mut child = self.spawn(args);
        let deadline = std::time::Instant::now() + limit;
        while child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("forkyard {args:?} did not answer within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.finish(child)
    }

    /// A started `forkyard` to its end: (exit code, stdout, stderr).
    fn finish(&mut self, child: std::process::Child) -> (Option<i32>, String, String) {
        let out = child.wait_with_output().expect("forkyard ends");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        self.printed.push_str(&stdout);
        self.printed.push_str(&stderr);
        (out.status.code(), stdout, stderr)
    }

    /// `forkyard fork … --wait`: the run's id (from "launched <id>"), and stdout.
    fn fork_and_wait(&mut self, url: &str, agent: &str, more: &[&str]) -> (String, String) {
        let mut args = vec!["fork", url, "-p", "add a file", "--agent-command", agent];
        args.extend(["--verify", "test -f verified", "--wait"]);
        args.extend(more);
        let (code, out, err) = self.run(&args);
        assert_eq!(code, Some(0), "{out}\n{err}");
        let id = err
            .lines()
            .find_map(|l| l.strip_prefix("launched "))
            .unwrap_or_else(|| panic!("no run id: {err}"));
        (id.trim().to_owned(), out)
    }
}

/// The commit at `refs/heads/<branch>` of the served repository, and the names of the
/// branches starting `<prefix>-`.
fn on_server(http: &GitHttp, branch: &str, prefix: &str) -> (String, Vec<String>) {
    let commit = git_in(
        &http.repo(),
        &["rev-parse", &format!("refs/heads/{branch}")],
    );
    let pattern = format!("refs/heads/{prefix}-*");
    let names = git_in(
        &http.repo(),
        &["for-each-ref", "--format=%(refname:short)", &pattern],
    );
    (commit, names.lines().map(str::to_owned).collect())
}

fn pull_of<'a>(pulls: &'a [Stored], head: &str) -> &'a Stored {
    let found = pulls.iter().find(|p| p.head == head);
    found.unwrap_or_else(|| panic!("no pull request of {head}: {pulls:#?}"))
}

fn pr_url(forge: &FakeForge, p: &Stored) -> String {
    format!("{}/{}/pull/{}", forge.url(), p.repo, p.number)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_pushes_the_winner_with_a_pull_request_and_publishes_another_fork_once() {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let token = fresh_token();
    let secrets = spellings(USER, &token);
    let http = GitHttp::serve(src.path(), USER, &token);
    let forge = FakeForge::start(&token).await;
    let dir = tempfile::tempdir().unwrap();
    let mut mesh = mesh(&http, &forge, &token, dir.path()).await;
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let (_, key) = new_key(&mesh, "team-a");
    let mut cli = Cli {
        gateway: mesh.endpoint("gateway"),
        key: key.clone(),
        config: tempfile::tempdir().unwrap(),
        printed: String::new(),
    };
    let agent = agent(&secrets);

    let (run_id, first_url) = winner_pushed_with_a_pull_request(&mut cli, &http, &forge, &agent);
    let (second_url, published) = fork_2_published(&mut cli, &http, &forge, &run_id).await;
    let urls = [first_url.as_str(), second_url.as_str()];
    let from = "the publishing gateway";
    shows_both(from, &mut cli, &mut gw, (&key, &run_id), urls).await;
    // As a gateway that kept nothing of the run shows it (another replica, a restart).
    mesh.terminate("gateway", Duration::from_secs(30));
    mesh.start_service("gateway").unwrap();
    let serving = mesh.wait_serving("gateway", Duration::from_secs(60)).await;
    serving.unwrap();
    let mut gw = Gw::new(mesh.channel("gateway").await.unwrap());
    let from = "a restarted gateway";
    shows_both(from, &mut cli, &mut gw, (&key, &run_id), urls).await;

    // Published again: the first outcome, nothing new on the server or the forge.
    let (calls, refs) = (forge.seen().len(), git_in(&http.repo(), &["for-each-ref"]));
    let (code, again, _) = cli.run(&["publish", &run_id, "2", "--pr"]);
    assert_eq!((code, again.trim()), (Some(0), published.as_str()));
    assert_eq!(forge.seen().len(), calls, "the forge was called again");
    assert_eq!(git_in(&http.repo(), &["for-each-ref"]), refs);

    let verified =
        verified_forks_pushed_and_the_winner_pulled(&mut cli, &mut gw, &http, &forge, &agent).await;

    // The token: used (every forge call carried it and was let in), and nowhere else.
    assert!(
        forge
            .seen()
            .iter()
            .all(|s| s.authorized && s.auth_header.is_some())
    );
    for (run, forks) in [(&run_id, 2), (&verified, 3)] {
        no_token_in_results(&mut gw, &key, run, forks, &secrets).await;
        assert_not_kept(&mesh, run, forks, &http.url(), &secrets);
    }
    assert_absent("what the CLI printed", &cli.printed, &secrets);
    assert_absent("a pull request", &format!("{:?}", forge.pulls()), &secrets);
    let bodies: Vec<_> = forge.seen().into_iter().filter_map(|s| s.body).collect();
    assert!(!bodies.is_empty());
    assert_absent("what the forge received", &format!("{bodies:?}"), &secrets);
}

/// The command, `fork … --push winner --pr --wait`: fork 1 verifies and wins,
/// and alone is pushed, with a pull request; the printed result names its branch,
/// commit and pull request. The run's id and the pull request's URL.
fn winner_pushed_with_a_pull_request(
    cli: &mut Cli,
    http: &GitHttp,
    forge: &FakeForge,
    agent: &str,
) -> (String, String) {
    let args = [
        "-f",
        "2",
        "--max-concurrent",
        "2",
        "--branch",
        "cli",
        "--push",
        "winner",
        "--pr",
    ];
    let (run_id, out) = cli.fork_and_wait(&http.url(), agent, &args);
    let (commit, branches) = on_server(http, "cli-fork-1", "cli");
    assert_eq!(branches, ["cli-fork-1"], "the winner alone");
    let pulls = forge.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    let first = pull_of(&pulls, "cli-fork-1");
    assert_eq!((first.base.as_str(), first.draft), ("main", false));
    let url = pr_url(forge, first);
    let shown = format!("pushed cli-fork-1 @ {}, {url}", &commit[..12]);
    assert!(out.contains(&shown), "{shown:?} not in:\n{out}");
    (run_id, url)
}

/// `publish <run> 2 --pr`: one new branch, one new pull request, as printed. While it
/// waits for the forge's answer, `result` of the fork answers at once: not delivered
/// yet. The pull request's URL and the printed line.
async fn fork_2_published(
    cli: &mut Cli,
    http: &GitHttp,
    forge: &FakeForge,
    run_id: &str,
) -> (String, String) {
    forge.hold_created(true);
    let publishing = cli.spawn(&["publish", run_id, "2", "--pr"]);
    for _ in 0..1200 {
        if forge.held() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(forge.held(), 1, "the publication's pull request never came");
    let (code, result, err) = cli.run_within(Duration::from_secs(20), &["result", run_id, "2"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!result.contains("delivered:"), "{result}");
    forge.hold_created(false);
    let (code, out, err) = cli.finish(publishing);
    assert_eq!(code, Some(0), "{out}{err}");
    let (commit, branches) = on_server(http, "cli-fork-2", "cli");
    assert_eq!(branches, ["cli-fork-1", "cli-fork-2"]);
    let pulls = forge.pulls();
    assert_eq!(pulls.len(), 2, "{pulls:#?}");
    let url = pr_url(forge, pull_of(&pulls, "cli-fork-2"));
    let line = format!(
        "fork 2: pushed cli-fork-2 @ {}, {url} ({})",
        &commit[..12],
        http.url()
    );
    assert_eq!(out.trim(), line);
    (url, line)
}

/// `status` and GetRun show both forks' pull requests, `result` the published one's,
/// as the gateway `from` answers.
async fn shows_both(
    from: &str,
    cli: &mut Cli,
    gw: &mut Gw,
    (key, run_id): (&str, &str),
    urls: [&str; 2],
) {
    let (code, status, err) = cli.run(&["status", run_id]);
    assert_eq!(code, Some(0), "{err}");
    for url in urls {
        assert!(status.contains(url), "{from}: {url} not in:\n{status}");
    }
    let (code, result, err) = cli.run(&["result", run_id, "2"]);
    assert_eq!(code, Some(0), "{err}");
    let shown = result.contains("delivered: pushed cli-fork-2 @ ");
    assert!(shown && result.contains(urls[1]), "{from}: {result}");
    let run = get(gw, key, run_id).await.expect("GetRun");
    for (f, url) in run.forks.iter().zip(urls) {
        let d = f
            .delivered
            .as_ref()
            .unwrap_or_else(|| panic!("{from}: {run:#?}"));
        assert_eq!(d.pull_request_url, url, "{from}: fork {}", f.fork);
    }
}

/// `--push verified --pr`: forks 1 and 3 verify and are pushed, fork 2 does not and is
/// not; one pull request, the winner's. The run's id.
async fn verified_forks_pushed_and_the_winner_pulled(
    cli: &mut Cli,
    gw: &mut Gw,
    http: &GitHttp,
    forge: &FakeForge,
    agent: &str,
) -> String {
    let before = forge.pulls().len();
    let args = [
        "-f",
        "3",
        "--max-concurrent",
        "3",
        "--branch",
        "ver",
        "--push",
        "verified",
        "--pr",
    ];
    let (run_id, _) = cli.fork_and_wait(&http.url(), agent, &args);
    let (_, branches) = on_server(http, "ver-fork-1", "ver");
    assert_eq!(branches, ["ver-fork-1", "ver-fork-3"], "the verified forks");
    let pulls = forge.pulls();
    assert_eq!(pulls.len(), before + 1, "one pull request: {pulls:#?}");
    let run: Run = get(gw, &cli.key, &run_id).await.expect("GetRun");
    assert_eq!(
        (run.state, run.winner),
        (RunState::Completed as i32, 1),
        "{run:#?}"
    );
    let winner = pull_of(&pulls, "ver-fork-1");
    for f in &run.forks {
        let d = f.delivered.clone().unwrap_or_default();
        let (pushed, pr) = match f.fork {
            1 => (true, pr_url(forge, winner)),
            3 => (true, String::new()),
            _ => (false, String::new()),
        };
        assert_eq!(!d.commit.is_empty(), pushed, "fork {}: {d:#?}", f.fork);
        assert_eq!(
            (d.pull_request_url, d.error.as_str()),
            (pr, ""),
            "fork {}",
            f.fork
        );
    }
    run_id
}

/// Each fork's sandbox held no token while its agent ran (its scan's report in its
/// patch), and no fork result or run view holds it.
async fn no_token_in_results(gw: &mut Gw, key: &str, run_id: &str, forks: u32, secrets: &[String]) {
    let run = get(gw, key, run_id).await.expect("GetRun");
    assert_absent("GetRun", &format!("{run:?}"), secrets);
    for fork in 1..=forks {
        let asked = GetForkResultRequest {
            run_id: run_id.into(),
            fork,
        };
        let f = gw
            .get_fork_result(with_key(key, asked))
            .await
            .expect("fork")
            .into_inner();
        assert_sandbox_clean(fork, &f.patch);
        assert_absent(&format!("fork {fork}'s result"), &format!("{f:?}"), secrets);
    }
}
