//! What the end-to-end tests share: request builders, waiting, leak checks, grpcurl.

use forkyard_proto::{
    budget::v1::{Account, GetAccountRequest, budget_ledger_client::BudgetLedgerClient},
    common::v1::{AgentSpec, ForkResult},
    gateway::v1::{
        GetForkResultRequest, GetRunRequest, LaunchRunRequest, Run, RunState,
        gateway_client::GatewayClient,
    },
    labels,
    sandbox::v1::{
        ListSandboxesRequest, ListSnapshotsRequest,
        sandbox_provisioner_client::SandboxProvisionerClient,
    },
};
use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};
use tonic::transport::Channel;

pub type Gateway = GatewayClient<Channel>;
pub type Ledger = BudgetLedgerClient<Channel>;

/// The run's ledger account (named by the run id): what it spent, holds, may spend.
pub async fn run_account(ledger: &mut Ledger, run_id: &str) -> Account {
    ledger
        .get_account(GetAccountRequest {
            account_id: run_id.into(),
        })
        .await
        .expect("get the run's ledger account")
        .into_inner()
}

/// A launch of `forks` forks of `command`, $1 budget, 120 s per fork.
pub fn launch(repo: &Path, forks: u32, max_concurrent: u32, command: &str) -> LaunchRunRequest {
    LaunchRunRequest {
        repo: repo.to_string_lossy().into_owned(),
        prompt: "make it better".into(),
        forks,
        max_concurrent,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: "command".into(),
            command: command.into(),
            ..Default::default()
        }),
        fork_timeout_secs: 120,
        ..Default::default()
    }
}

pub async fn get_run(gw: &mut Gateway, run_id: &str) -> Run {
    gw.get_run(GetRunRequest {
        run_id: run_id.into(),
    })
    .await
    .expect("get run")
    .into_inner()
}

pub async fn fork_result(gw: &mut Gateway, run_id: &str, fork: u32) -> ForkResult {
    gw.get_fork_result(GetForkResultRequest {
        run_id: run_id.into(),
        fork,
    })
    .await
    .expect("get fork result")
    .into_inner()
}

/// Poll until `done(run)` holds, or fail after `timeout` showing the run.
pub async fn wait_until(
    gw: &mut Gateway,
    run_id: &str,
    timeout: Duration,
    done: impl Fn(&Run) -> bool,
) -> Run {
    let deadline = Instant::now() + timeout;
    loop {
        let run = get_run(gw, run_id).await;
        if done(&run) {
            return run;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} never got there: {run:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn is_closed(run: &Run) -> bool {
    ![
        RunState::Running as i32,
        RunState::Paused as i32,
        RunState::AwaitingBudget as i32,
    ]
    .contains(&run.state)
}

pub async fn wait_finished(gw: &mut Gateway, run_id: &str, timeout: Duration) -> Run {
    wait_until(gw, run_id, timeout, is_closed).await
}

/// Launch `req` and wait (up to `timeout`) for the run to finish: its id and its end.
pub async fn run_to_end(
    gw: &mut Gateway,
    req: LaunchRunRequest,
    timeout: Duration,
) -> (String, Run) {
    let run_id = gw
        .launch_run(req)
        .await
        .expect("launch")
        .into_inner()
        .run_id;
    let run = wait_finished(gw, &run_id, timeout).await;
    (run_id, run)
}

/// Processes still running inside a sandbox of this mesh: every sandboxed command has
/// `FORKYARD_SANDBOX_ID` in its environment, and bwrap itself names the sandboxes dir.
/// A sandbox is this mesh's when its provisioner's log names it: the live sandboxes of
/// other tests running meanwhile (an agent sleeping through an outage) are theirs to
/// check. Each is named with what tells whose it is: its sandbox, its cgroup, how long it
/// has run.
pub fn sandbox_processes(state: &Path) -> Vec<String> {
    let dir = state.join("sandboxes").to_string_lossy().into_owned();
    let ours = sandbox_ids_in_logs(state);
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let sandbox = env
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(b"FORKYARD_SANDBOX_ID="))
            .map(|v| String::from_utf8_lossy(v).into_owned());
        if cmd.contains(&dir) || sandbox.as_ref().is_some_and(|id| ours.contains(id)) {
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            found.push(format!(
                "{}: {cmd} (sandbox {}, cgroup {}, running {})",
                entry.file_name().to_string_lossy(),
                sandbox.as_deref().unwrap_or("?"),
                cgroup.trim(),
                age(&entry.path()).map_or("?".into(), |s| format!("{s:.1} s")),
            ));
        }
    }
    found
}

/// Every `sbx-<32 hex>` id the mesh's logs (`<state>/logs`) name.
fn sandbox_ids_in_logs(state: &Path) -> std::collections::HashSet<String> {
    let mut ids = std::collections::HashSet::new();
    for entry in std::fs::read_dir(state.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("sbx-") {
            let id: String = rest[at..].chars().take(4 + 32).collect();
            if id.len() == 36 && id[4..].bytes().all(|b| b.is_ascii_hexdigit()) {
                ids.insert(id);
            }
            rest = &rest[at + 4..];
        }
    }
    ids
}

/// How long the process at `/proc/<pid>` has run, in seconds.
fn age(proc_dir: &Path) -> Option<f64> {
    // Field 22 of `stat`, after the command's parenthesised name: the start time in clock
    // ticks since boot (100 a second on Linux).
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let start: f64 = after_name.split(' ').nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    Some(uptime - start / 100.0)
}

/// What `left` still finds, once it finds nothing or after 10 s: destroys remove their
/// sandboxes' files and processes as they go, so a check right after a run may race them.
pub async fn left_after_settling(left: impl Fn() -> Vec<String>) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = left();
        if found.is_empty() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// No sandbox and no snapshot of the run (fork trees), on the provisioner and on its
/// disk, and nothing of any sandbox left on this host.
pub async fn assert_no_sandbox_or_snapshot(
    mesh: &crate::Mesh,
    prov: &SandboxProvisionerClient<Channel>,
    run_id: &str,
) {
    let by_run = HashMap::from([(labels::RUN_ID.to_owned(), run_id.to_owned())]);
    let sandboxes = prov
        .clone()
        .list_sandboxes(ListSandboxesRequest {
            label_selector: by_run.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    let snapshots = prov
        .clone()
        .list_snapshots(ListSnapshotsRequest { labels: by_run })
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert!(snapshots.is_empty(), "snapshots left: {snapshots:?}");
    let on_disk: Vec<_> = walk_snapshots(mesh.state_dir());
    assert!(on_disk.is_empty(), "snapshot files left: {on_disk:?}");
    assert_nothing_left_on_host(mesh.state_dir());
}

/// Files of any `snapshots` directory under the mesh's state.
fn walk_snapshots(state: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![state.to_owned()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                if p.file_name().is_some_and(|n| n == "snapshots") {
                    found.extend(
                        std::fs::read_dir(&p)
                            .into_iter()
                            .flatten()
                            .flatten()
                            .map(|e| e.path()),
                    );
                } else if !p.ends_with("sandboxes") {
                    dirs.push(p);
                }
            }
        }
    }
    found
}

/// No sandbox's workspace and no sandbox process left on this host (the mesh's state
/// directory `state`).
pub fn assert_nothing_left_on_host(state: &Path) {
    let workspaces = workspaces_left(state);
    assert!(workspaces.is_empty(), "workspaces left: {workspaces:?}");
    let processes = sandbox_processes(state);
    assert!(
        processes.is_empty(),
        "sandbox processes left: {processes:?}"
    );
}

pub fn workspaces_left(state: &Path) -> Vec<String> {
    std::fs::read_dir(state.join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The most forks whose lifetimes overlapped at any moment (each fork's sandbox lives
/// inside its [started, finished] interval).
pub fn max_overlap(forks: &[ForkResult]) -> usize {
    let mut edges: Vec<(i64, i32)> = forks
        .iter()
        .filter(|f| f.started_unix_ms > 0)
        .flat_map(|f| {
            [
                (f.started_unix_ms, 1),
                (f.finished_unix_ms.max(f.started_unix_ms), -1),
            ]
        })
        .collect();
    // Ends before starts at the same millisecond: back-to-back is not overlap.
    edges.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        max = max.max(now);
    }
    max as usize
}

pub fn grpcurl(args: &[&str]) -> String {
    let out =
        std::process::Command::new(std::env::var("GRPCURL").unwrap_or_else(|_| "grpcurl".into()))
            .args(args)
            .output()
            .expect("grpcurl is installed (make test installs it)");
    assert!(
        out.status.success(),
        "grpcurl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
