//! The real agent CLIs in forks, through the whole mesh: `claude` (Claude Code) and
//! `codex` run in each fork's sandbox, reach a scripted model server speaking the
//! Anthropic / OpenAI wire protocol only through the agent runner's metering LLM
//! gateway, and carry out the model's tool call. Checked: the edit is in the patch, the
//! ledger holds exactly the priced usage, a model that will not stop is stopped at the
//! fork's budget, and the real API key is nowhere but in the request to the model (not in
//! the sandbox's environment, files or processes, the logs, the transcript, or the run's
//! Temporal history).
//!
//! `make test` installs the CLIs (pinned, from npm); without them these tests fail.
//! Claude Code also runs in forks on an image that brings it (and not the host's /usr).

#[path = "../../services/sandbox-provisioner/tests/common/test_image.rs"]
mod test_image;

use forkyard_proto::{
    budget::v1::budget_ledger_client::BudgetLedgerClient,
    common::v1::{AgentSpec, ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    mesh::{MeshOptions, temporal_cli},
    otlp::{SpanRecord, TraceSink},
    repo,
    scripted_model::{CACHED_TOKENS, INPUT_TOKENS, OUTPUT_TOKENS, Script, ScriptedModel},
    support::{fork_result, run_account, run_to_end},
};
use std::{path::Path, time::Duration};

const ANTHROPIC_KEY: &str = "sk-ant-api03-e2eREALKEY-4c1d9";
const OPENAI_KEY: &str = "sk-proj-e2eREALKEY-77b0e";
/// Every fork token starts so (`llm_gateway::grants`).
const TOKEN_PREFIX: &str = "fyk-llm-";

/// What the scripted tool call runs inside the sandbox: the edit, then evidence of what
/// the sandbox holds (its environment, and every file and process that mentions the real
/// keys), all into the workspace so it comes back in the patch. The key patterns are
/// built at run time so the command's own text (in the CLI's session log) never matches;
/// the fork's token is masked (a dead token, but still no secret for the patch).
fn edit_and_scan(line: &str) -> String {
    format!(
        "printf '{line}\\n' >> notes.txt; t=$(printf 'fyk-%s' llm-); env | sort | sed -E \"s/$t[0-9a-f]{{64}}/[fork token]/\" > .sandbox-env.txt; \
         p1=$(printf 'sk-ant-api03-%s' e2eREALKEY); p2=$(printf 'sk-proj-%s' e2eREALKEY); \
         {{ grep -rIl -e \"$p1\" -e \"$p2\" /workspace /tmp /etc /run 2>/dev/null; \
            for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -l -e \"$p1\" -e \"$p2\" \"$f\" 2>/dev/null; done; }} \
         > .key-scan.txt; true"
    )
}

fn options(model: &ScriptedModel) -> MeshOptions {
    let runner = |k: &str, v: &str| ("agent-runner".to_owned(), k.to_owned(), v.to_owned());
    MeshOptions {
        service_env: vec![
            runner("ANTHROPIC_BASE_URL", &model.url),
            runner("ANTHROPIC_API_KEY", ANTHROPIC_KEY),
            runner("OPENAI_BASE_URL", &format!("{}/v1", model.url)),
            runner("OPENAI_API_KEY", OPENAI_KEY),
        ],
        ..Default::default()
    }
}

fn launch(repo: &Path, driver: &str, model: &str, forks: u32, budget: &str) -> LaunchRunRequest {
    LaunchRunRequest {
        repo: repo.to_string_lossy().into_owned(),
        prompt: "Add a line to notes.txt".into(),
        forks,
        max_concurrent: forks,
        budget_usd: budget.into(),
        agent: Some(AgentSpec {
            driver: driver.into(),
            model: model.into(),
            ..Default::default()
        }),
        fork_timeout_secs: 180,
        ..Default::default()
    }
}

fn assert_cli_installed(cli: &str) {
    let found = std::process::Command::new(cli)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "the {cli} CLI is not installed: `make test` installs it (npm)"
    );
}

/// The key and the fork tokens are in no log, transcript or Temporal payload of the run.
async fn assert_no_secret_leaked(mesh: &Mesh, run_id: &str, forks: &[ForkResult]) {
    for entry in std::fs::read_dir(mesh.state_dir()).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for secret in [ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX] {
                assert!(!text.contains(secret), "{secret} in {}", path.display());
            }
        }
    }
    for f in forks {
        for secret in [ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX] {
            assert!(
                !f.transcript.contains(secret),
                "{secret} in fork {} transcript",
                f.fork
            );
            assert!(
                !f.agent_output_tail.contains(secret),
                "{secret} in fork {} output",
                f.fork
            );
        }
    }
    let history = std::process::Command::new(temporal_cli())
        .args([
            "workflow",
            "show",
            "--output",
            "json",
            "--workflow-id",
            run_id,
        ])
        .args([
            "--address",
            &mesh.temporal_address(),
            "--namespace",
            "default",
        ])
        .output()
        .expect("temporal workflow show");
    assert!(
        history.status.success(),
        "{}",
        String::from_utf8_lossy(&history.stderr)
    );
    let history: serde_json::Value =
        serde_json::from_slice(&history.stdout).expect("history as JSON");
    // Payloads are base64 (`data`): read them decoded, every one.
    let mut decoded = String::new();
    payload_texts(&history, &mut decoded);
    assert!(
        decoded.contains("Add a line to notes.txt") && decoded.contains("llm_gateway"),
        "the run's payloads were not read"
    );
    let raw = history.to_string();
    for secret in [ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX] {
        assert!(
            !decoded.contains(secret),
            "{secret} in a Temporal payload of {run_id}"
        );
        assert!(
            !raw.contains(secret),
            "{secret} in the Temporal history of {run_id}"
        );
    }
}

/// Every `data` string under `v`, base64-decoded, appended to `out`.
fn payload_texts(v: &serde_json::Value, out: &mut String) {
    use base64::Engine;
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if k == "data"
                    && let Some(text) = v.as_str()
                    && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text)
                {
                    out.push_str(&String::from_utf8_lossy(&bytes));
                    out.push('\n');
                }
                payload_texts(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| payload_texts(v, out)),
        _ => {}
    }
}

/// What the sandbox saw, from the files the scripted command wrote into the patch.
fn assert_sandbox_held_only_the_token(fork: &ForkResult, key_var: &str) {
    let added = |file: &str| -> String {
        let start = fork
            .patch
            .find(&format!("+++ b/{file}"))
            .unwrap_or_else(|| panic!("{file} not in the patch:\n{}", fork.patch));
        fork.patch[start..]
            .lines()
            .skip(2)
            .take_while(|l| !l.starts_with("diff --git"))
            .filter_map(|l| l.strip_prefix('+'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let env = added(".sandbox-env.txt");
    assert!(
        env.lines().any(|l| l == format!("{key_var}=[fork token]")),
        "{key_var} is not the fork token:\n{env}"
    );
    assert!(
        !env.contains("e2eREALKEY"),
        "a real key in the sandbox environment:\n{env}"
    );
    assert!(
        env.contains("FORKYARD_LLM_URL=http://127.0.0.1:4000"),
        "{env}"
    );
    // The scan file is empty: no file or process in the sandbox mentions a real key.
    assert!(
        !fork.patch.contains("+++ b/.key-scan.txt"),
        "the sandbox holds a real key: {}",
        added(".key-scan.txt")
    );
    assert!(
        fork.patch.contains(".key-scan.txt"),
        "the scan never ran:\n{}",
        fork.patch
    );
}

/// Per model call, micro-USD: the scripted usage priced from the runner's table.
fn price_per_call(input: f64, output: f64, cache_read: f64) -> i64 {
    let micro = (INPUT_TOKENS - CACHED_TOKENS) as f64 * input
        + OUTPUT_TOKENS as f64 * output
        + CACHED_TOKENS as f64 * cache_read;
    (micro - 1e-6).ceil() as i64
}

/// An image (`<dir>/<name>`) holding only the agent CLI's own executable (`exe`,
/// resolved, and linked from `link`), the shell and the few tools the scripted tool call
/// runs, with their libraries: nothing else of this host.
fn agent_image(dir: &Path, name: &str, exe: &str, link: &str) {
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|e| panic!("{exe}: {e}"));
    let exe = exe.to_str().unwrap();
    let tools = [
        "/bin/bash",
        "/usr/bin/env",
        "/usr/bin/sort",
        "/usr/bin/sed",
        "/usr/bin/grep",
    ];
    let programs: Vec<&str> = tools.iter().copied().chain([exe]).collect();
    test_image::save_image_of(dir, name, &programs, &[], &[(link, exe)]);
}

/// `<codex package>/node_modules/@openai/codex-linux-<arch>/vendor/<target>/bin/codex`.
fn codex_native() -> Option<String> {
    let wrapper = std::fs::canonicalize("/usr/bin/codex").ok()?;
    let scoped = wrapper.parent()?.parent()?.join("node_modules/@openai");
    std::fs::read_dir(scoped)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("codex-linux-"))
        .flat_map(|e| {
            std::fs::read_dir(e.path().join("vendor"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|target| target.path().join("bin/codex"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

/// A run's image: the archive directory the provisioners get and the image's name.
struct OnImage<'a> {
    archives: &'a Path,
    image: &'a str,
}

async fn run_cli_forks(driver: &str, model_name: &str, key_var: &str, per_call: i64, line: &str) {
    run_cli_forks_on(driver, model_name, key_var, per_call, line, None).await;
}

async fn run_cli_forks_on(
    driver: &str,
    model_name: &str,
    key_var: &str,
    per_call: i64,
    line: &str,
    on_image: Option<OnImage<'_>>,
) {
    let model = ScriptedModel::start(Script::edit(&edit_and_scan(line))).await;
    let mut opts = options(&model);
    let sink_dir = tempfile::tempdir().unwrap();
    let sink = TraceSink::start(&sink_dir.path().join("spans.jsonl"))
        .await
        .unwrap();
    opts.env.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), sink.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "200".to_owned()),
    ]);
    if let Some(img) = &on_image {
        opts.service_env.push((
            "sandbox-provisioner".into(),
            "FORKYARD_IMAGE_ARCHIVE_DIR".into(),
            img.archives.display().to_string(),
        ));
    }
    let mesh = Mesh::start_with(opts).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    std::fs::write(repo_dir.join("notes.txt"), "notes\n").unwrap();
    repo::commit_all(&repo_dir, "notes").unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let req = LaunchRunRequest {
        request_id: format!("{driver}-e2e"),
        // On the image, the host's git (and all of its /usr) is out of sight.
        verify_command: match on_image {
            Some(_) => format!("grep -qx '{line}' notes.txt && test ! -e /usr/bin/git"),
            None => format!("grep -qx '{line}' notes.txt"),
        },
        image: on_image
            .as_ref()
            .map(|i| i.image.to_owned())
            .unwrap_or_default(),
        ..launch(&repo_dir, driver, model_name, 2, "1")
    };
    let (run_id, run) = run_to_end(&mut gw, req, Duration::from_secs(240)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let mut forks = Vec::new();
    for n in 1..=2 {
        let fork = fork_result(&mut gw, &run_id, n).await;
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
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    let total: i64 = forks.iter().map(|f| f.cost_micros).sum();
    assert_eq!(
        account.spent_micros, total,
        "the ledger holds exactly the forks' costs"
    );
    assert_eq!(account.reserved_micros, 0);
    assert_no_secret_leaked(&mesh, &run_id, &forks).await;
    assert_model_requests_traced(&sink, &run_id, calls.len()).await;
}

/// Every model request the CLIs made through the gateway is an `llm.request` span in the
/// run's trace, under its fork's agent activity, with its charge to the ledger under it;
/// and no span anywhere carries a key or a fork's token.
async fn assert_model_requests_traced(sink: &TraceSink, run_id: &str, calls: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = sink.spans();
        let requests = spans.iter().filter(|s| s.name == "llm.request").count();
        let charges = spans
            .iter()
            .filter(|s| {
                s.name == "forkyard.budget.v1.BudgetLedger/Charge" && s.service == "budget-ledger"
            })
            .count();
        if (requests >= calls && charges >= calls) || std::time::Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let by_id: std::collections::HashMap<&str, &SpanRecord> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let ancestors = |s: &SpanRecord| {
        let mut chain = Vec::new();
        let mut cur = s;
        while let Some(p) = by_id.get(cur.parent_span_id.as_str()) {
            chain.push(*p);
            cur = p;
        }
        chain
    };
    let requests: Vec<&SpanRecord> = spans
        .iter()
        .filter(|s| s.name == "llm.request" && s.attr_str("run_id").as_deref() == Some(run_id))
        .collect();
    assert_eq!(requests.len(), calls, "an llm.request span per model call");
    for r in &requests {
        assert_eq!(r.service, "agent-runner");
        assert_eq!(
            r.attr_str("http.response.status_code").as_deref(),
            Some("200")
        );
        let chain = ancestors(r);
        let agent = chain
            .iter()
            .find(|a| a.name == "RunActivity:agent.run")
            .unwrap_or_else(|| panic!("llm.request not under an agent activity: {r:?}"));
        assert_eq!(agent.attr_str("forkyard.fork"), r.attr_str("fork"));
        assert_eq!(agent.attr_str("forkyard.run_id").as_deref(), Some(run_id));
        assert!(
            chain
                .iter()
                .any(|a| a.name == "forkyard.gateway.v1.Gateway/LaunchRun"),
            "the request is in the run's trace: {:?}",
            chain.iter().map(|a| &a.name).collect::<Vec<_>>()
        );
        let charged = spans.iter().any(|s| {
            s.service == "budget-ledger"
                && s.name == "forkyard.budget.v1.BudgetLedger/Charge"
                && ancestors(s).iter().any(|a| a.span_id == r.span_id)
        });
        assert!(
            charged,
            "the request's charge reached the ledger under it: {r:?}"
        );
    }
    for s in &spans {
        for v in s.attributes.values() {
            let v = v.to_string();
            assert!(
                !v.contains(ANTHROPIC_KEY) && !v.contains(OPENAI_KEY) && !v.contains(TOKEN_PREFIX),
                "a secret in span {} ({}): {v}",
                s.name,
                s.service
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_forks_edit_through_the_gateway_and_pay_exactly_their_usage() {
    assert_cli_installed("claude");
    // claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read per million tokens.
    run_cli_forks(
        "claude-code",
        "sonnet",
        "ANTHROPIC_API_KEY",
        price_per_call(3.0, 15.0, 0.3),
        "edited by claude",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_in_forks_on_an_image_that_brings_it() {
    assert_cli_installed("claude");
    let archives = tempfile::tempdir().unwrap();
    agent_image(
        archives.path(),
        "claude.tar",
        "/usr/bin/claude",
        "/usr/bin/claude",
    );
    run_cli_forks_on(
        "claude-code",
        "sonnet",
        "ANTHROPIC_API_KEY",
        price_per_call(3.0, 15.0, 0.3),
        "edited by claude on its image",
        Some(OnImage {
            archives: archives.path(),
            image: "archive:claude.tar",
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_in_forks_on_an_image_that_brings_it() {
    assert_cli_installed("codex");
    // Codex's native executable (what the npm wrapper starts, a static binary) as the
    // image's `codex`: the image needs no node.
    let native = codex_native().expect("codex's native executable in its npm package");
    let archives = tempfile::tempdir().unwrap();
    agent_image(archives.path(), "codex.tar", &native, "/usr/bin/codex");
    run_cli_forks_on(
        "codex",
        "gpt-5",
        "OPENAI_API_KEY",
        price_per_call(1.25, 10.0, 0.125),
        "edited by codex on its image",
        Some(OnImage {
            archives: archives.path(),
            image: "archive:codex.tar",
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_forks_edit_through_the_gateway_and_pay_exactly_their_usage() {
    assert_cli_installed("codex");
    // gpt-5: $1.25 in, $10 out, $0.125 cached per million tokens.
    run_cli_forks(
        "codex",
        "gpt-5",
        "OPENAI_API_KEY",
        price_per_call(1.25, 10.0, 0.125),
        "edited by codex",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_never_stops_is_stopped_at_the_forks_budget() {
    assert_cli_installed("claude");
    let model = ScriptedModel::start(Script::never_stop("echo again >> notes.txt")).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    let per_call = price_per_call(3.0, 15.0, 0.3);
    // Room for three calls' charges, not four.
    let budget = format!("0.{:06}", per_call * 3 + per_call / 2);
    let req = LaunchRunRequest {
        request_id: "never-stops".into(),
        ..launch(&repo_dir, "claude-code", "sonnet", 1, &budget)
    };
    let (run_id, run) = run_to_end(&mut gw, req, Duration::from_secs(180)).await;
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(
        fork.status,
        ForkStatus::BudgetExceeded as i32,
        "{fork:#?} {run:#?}"
    );
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros,
        3 * per_call,
        "three charges accepted, the fourth refused"
    );
    assert_eq!(account.reserved_micros, 0);
    assert_eq!(fork.cost_micros, account.spent_micros);
    // The fourth answer's charge was refused; nothing after it reached the model.
    assert_eq!(
        model.model_calls().len(),
        4,
        "{:?}",
        model.model_calls().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_failed_by_a_down_model_api_is_retried_and_charged_once() {
    let mut script = Script::edit("true");
    script.fail_first = 1;
    let model = ScriptedModel::start(script).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    repo::create(&repo_dir).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());
    // A plain command calling the Messages API through the gateway; curl -f fails on 503.
    let command = r#"curl -sSf -H "x-api-key: $ANTHROPIC_API_KEY" -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' -d '{"model":"claude-haiku-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' "$ANTHROPIC_BASE_URL/v1/messages" > answer.json"#;
    let req = LaunchRunRequest {
        request_id: "api-down".into(),
        ..launch(&repo_dir, "command", "", 1, "1")
    };
    let mut req = req;
    req.agent.as_mut().unwrap().command = command.into();
    let (run_id, run) = run_to_end(&mut gw, req, Duration::from_secs(120)).await;
    let fork = fork_result(&mut gw, &run_id, 1).await;
    assert_eq!(
        fork.status,
        ForkStatus::Succeeded as i32,
        "{fork:#?} {run:#?}"
    );
    assert!(
        fork.patch.contains("msg_scripted_2"),
        "the second attempt's answer: {}",
        fork.patch
    );
    assert_eq!(
        model.model_calls().len(),
        2,
        "one failed call, one answered"
    );
    // claude-haiku-4-5: 800 in × $1, 200 cache read × $0.10, 200 out × $5 per million.
    let per_call = price_per_call(1.0, 5.0, 0.1);
    assert_eq!(fork.model_cost_micros, per_call, "{fork:#?}");
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let account = run_account(&mut ledger, &run_id).await;
    assert_eq!(
        account.spent_micros, per_call,
        "the failed call cost nothing, the answer once"
    );
}
