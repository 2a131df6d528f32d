//! Two forks of a real agent CLI through the whole mesh, and what is checked of them: the
//! edit in each patch, each model call metered once with the real key and paid exactly,
//! the ledger holding the forks' costs, no key where it must not be, every call traced.

use super::{
    model_mesh::{ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX, launch, options},
    secrets::{assert_no_secret_leaked, assert_sandbox_held_only_the_token, edit_and_scan},
    traces::assert_model_requests_traced,
};
use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::{LaunchRunRequest, RunState},
};
use forkyard_tests::{
    Mesh,
    otlp::TraceSink,
    repo,
    scripted_model::{CACHED_TOKENS, OUTPUT_TOKENS, Script, ScriptedModel},
    support::{Gateway, fork_result, run_account, run_to_end},
};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// A run's image: the archive directory the provisioners get and the image's name.
pub struct OnImage<'a> {
    pub archives: &'a Path,
    pub image: &'a str,
}

/// Two forks of `driver` with `model_name` (on `on_image`, if given), whose model's tool
/// call appends `line` to notes.txt; `key_var` names the key the CLI reads and `per_call`
/// is what one model call costs.
pub async fn run_cli_forks_on(
    driver: &str,
    model_name: &str,
    key_var: &str,
    per_call: i64,
    line: &str,
    on_image: Option<OnImage<'_>>,
) {
    let place = Placement {
        on_image,
        isolation: "",
    };
    run_cli_forks_placed(driver, model_name, key_var, per_call, line, place).await;
}

/// Where a run's sandboxes are: on an image or the host's tools, and under which
/// isolation (`""`: the default, bubblewrap; `"gvisor"`).
pub struct Placement<'a> {
    pub on_image: Option<OnImage<'a>>,
    pub isolation: &'a str,
}

/// [`run_cli_forks_on`], placed as `place` says. Under gVisor the verify also checks
/// that the sandbox's kernel is gVisor's (its boot log), not the host's.
pub async fn run_cli_forks_placed(
    driver: &str,
    model_name: &str,
    key_var: &str,
    per_call: i64,
    line: &str,
    place: Placement<'_>,
) {
    let Placement {
        on_image,
        isolation,
    } = place;
    let model = ScriptedModel::start(Script::edit(&edit_and_scan(line))).await;
    let sink_dir = tempfile::tempdir().unwrap();
    let (mesh, sink) = traced_mesh(&model, sink_dir.path(), on_image.as_ref()).await;
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = notes_repo(dir.path());
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());
    let req = LaunchRunRequest {
        request_id: format!("{driver}-e2e"),
        // On the image, the host's git (and all of its /usr) is out of sight.
        verify_command: match (&on_image, isolation) {
            (Some(_), _) => format!("grep -qx '{line}' notes.txt && test ! -e /usr/bin/git"),
            (None, "gvisor") => format!("grep -qx '{line}' notes.txt && dmesg | grep -q gVisor"),
            (None, _) => format!("grep -qx '{line}' notes.txt"),
        },
        isolation: isolation.to_owned(),
        image: on_image
            .as_ref()
            .map(|i| i.image.to_owned())
            .unwrap_or_default(),
        ..launch(&repo_dir, driver, model_name, 2, "1")
    };
    let (run_id, run) = run_to_end(&mut gw, req, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let forks = checked_forks(&mut gw, &run_id, line, key_var, per_call).await;
    let calls = assert_each_call_metered_with_the_key(&model, &forks, driver);
    assert_ledger_holds_the_forks_costs(&mesh, &run_id, &forks).await;
    assert_no_secret_leaked(&mesh, &run_id, &forks).await;
    assert_model_requests_traced(&sink, &run_id, calls).await;
}

/// A mesh whose runner reaches `model`, exporting every service's spans to a sink (files
/// in `sink_dir`), its provisioners given the image archives if the run is on an image.
async fn traced_mesh(
    model: &ScriptedModel,
    sink_dir: &Path,
    on_image: Option<&OnImage<'_>>,
) -> (Mesh, TraceSink) {
    let mut opts = options(model);
    let sink = TraceSink::start(&sink_dir.join("spans.jsonl"))
        .await
        .unwrap();
    opts.env.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), sink.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "200".to_owned()),
    ]);
    if let Some(img) = on_image {
        opts.service_env.push((
            "sandbox-provisioner".into(),
            "FORKYARD_IMAGE_ARCHIVE_DIR".into(),
            img.archives.display().to_string(),
        ));
    }
    let mesh = Mesh::start_with(opts).await.expect("mesh");
    (mesh, sink)
}

/// A repository under `dir` with a notes.txt for the agents to add to.
pub fn notes_repo(dir: &Path) -> PathBuf {
    let repo_dir = dir.join("repo");
    repo::create(&repo_dir).unwrap();
    std::fs::write(repo_dir.join("notes.txt"), "notes\n").unwrap();
    repo::commit_all(&repo_dir, "notes").unwrap();
    repo_dir
}

/// Both forks succeeded and verified with `line` in their patch, the sandbox held only
/// the fork's token, and each paid exactly its model calls and its sandbox.
async fn checked_forks(
    gw: &mut Gateway,
    run_id: &str,
    line: &str,
    key_var: &str,
    per_call: i64,
) -> Vec<ForkResult> {
    let mut forks = Vec::new();
    for n in 1..=2 {
        let fork = fork_result(gw, run_id, n).await;
        assert_eq!(fork.status, ForkStatus::Succeeded as i32, "{fork:#?}");
        assert_eq!(fork.verify, VerifyStatus::Passed as i32, "{fork:#?}");
        assert!(fork.patch.contains(&format!("+{line}")), "{}", fork.patch);
        assert_sandbox_held_only_the_token(&fork, key_var);
        // Exactly its requests: each one's usage, priced.
        let usage = fork.usage.unwrap_or_default();
        let calls = usage.output_tokens / OUTPUT_TOKENS;
        assert!(calls >= 2, "{usage:?}");
        assert_eq!(usage.cache_read_tokens, calls * CACHED_TOKENS);
        assert_eq!(fork.model_cost_micros, calls as i64 * per_call, "{fork:#?}");
        assert_eq!(
            fork.cost_micros,
            fork.model_cost_micros + fork.sandbox_cost_micros
        );
        forks.push(fork);
    }
    forks
}

/// The model saw every call the forks were charged for, each with the real key and no
/// fork token: how many calls.
fn assert_each_call_metered_with_the_key(
    model: &ScriptedModel,
    forks: &[ForkResult],
    driver: &str,
) -> usize {
    let calls = model.model_calls();
    assert_eq!(
        calls.len() as u64,
        forks
            .iter()
            .map(|f| f.usage.unwrap_or_default().output_tokens / OUTPUT_TOKENS)
            .sum::<u64>(),
        "every model call was metered once"
    );
    for c in &calls {
        let presented = c
            .header("x-api-key")
            .or(c.header("authorization"))
            .unwrap_or_default();
        assert!(
            presented.ends_with(if driver == "codex" {
                OPENAI_KEY
            } else {
                ANTHROPIC_KEY
            }),
            "{c:?}"
        );
        assert!(
            c.headers.iter().all(|(_, v)| !v.contains(TOKEN_PREFIX)),
            "token sent upstream: {c:?}"
        );
    }
    calls.len()
}

async fn assert_ledger_holds_the_forks_costs(mesh: &Mesh, run_id: &str, forks: &[ForkResult]) {
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, run_id).await;
    let total: i64 = forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(
        account.spent_micros, total,
        "the ledger holds exactly the forks' costs"
    );
    assert_eq!(account.reserved_micros, 0);
}
