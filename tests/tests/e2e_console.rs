//! The run console (services/console) in a real browser: Debian's headless Chromium,
//! driven through chromedriver, against a real mesh with API keys on. A key signs in; a
//! run of 3 forks launched from the form shows on the runs page and its forks turn
//! succeeded live; the fork page shows the patch; two forks side by side; cancel from
//! the page; refusals (no key, another tenant's run, unknown run or fork, a bad form, a
//! forged POST); and `<script>` in a prompt, a patch, a label and a transcript runs
//! nothing. The run page's cost chart is drawn; a fork's transcript reads as a
//! conversation; an admin tenant's key reads every tenant's runs and changes none;
//! the live view reconnects after a gateway restart; pause, resume and a budget raise
//! (refused, then made) from the page. A search from the form's optional fields: refused
//! next to its field, then run (its second round branching the first's fork). Image,
//! egress and delivery from the form: a pull request without a push, a push of a local
//! repository's forks and a private egress address refused next to their fields; a run
//! with the egress named.
//! Screenshots of each page are kept (the directory is printed) and checked as images.

#[allow(dead_code)]
mod tenant_calls;

use console::{Console, XSS, actions};
use forkyard_proto::gateway::v1::{ListRunsRequest, RunState};
use forkyard_tests::{Mesh, mesh::MeshOptions, repo};
use std::{path::Path, time::Duration};
use tenant_calls::{Gw, new_key, wait_closed, with_key};

mod console;

/// Each fork appends its own line to README.md and adds a page holding a script, then
/// waits, so the run page is open while its forks are still running; it prints a
/// message, a tool call and its result as claude-code's stream-json would (the
/// transcript). One line: typed into a text field, a newline would submit the form.
const AGENT: &str = "echo \"console line of fork $FORKYARD_FORK\" >> README.md; printf '%s\\n' '<script>window.__pwned=3</script>' > page.html; echo '{\"type\":\"assistant\",\"message\":{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"<script>window.__pwned=4</script><img src=x onerror=window.__pwned=5> editing\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"Bash\",\"input\":{\"command\":\"echo hi\"}}]}}'; echo '{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"tool said hi\"}]}}'; sleep 6; echo '{\"type\":\"result\",\"total_cost_usd\":0.01,\"usage\":{\"input_tokens\":100,\"output_tokens\":20}}'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_a_real_browser() {
    let mut mesh = Mesh::start_with(MeshOptions {
        api_keys: true,
        env: vec![("FORKYARD_ADMIN_TENANTS".into(), "ops".into())],
        ..Default::default()
    })
    .await
    .expect("mesh");
    let base = mesh.start_console().await.expect("console");
    let (_, key_a) = new_key(&mesh, "team-a");
    let (_, key_b) = new_key(&mesh, "team-b");
    let (_, key_ops) = new_key(&mesh, "ops");
    let mut gw = Gw::new(mesh.channel("gateway").await.expect("gateway"));
    let src = tempfile::tempdir().expect("tempdir");
    repo::create(src.path()).expect("repo");
    let c = Console::start(base).await;

    c.refused_without_key().await;
    c.sign_in(&key_a).await;
    bad_form_starts_nothing(&c, &mut gw, &key_a, src.path()).await;
    let run_id = launch_from_form(&c, src.path()).await;
    forks_succeed_live(&c, &run_id).await;
    c.runs_page_lists(&run_id).await;
    c.fork_page_shows_patch(&run_id).await;
    c.compare_side_by_side(&run_id).await;
    actions::pages_fit_a_phone(&c, &run_id).await;
    c.hidden_and_unknown_are_404(&key_b, &run_id).await;
    actions::admin_key_reads_every_tenant(&c, &key_ops, &run_id).await;
    steer_from_page(&c, &mut mesh, &mut gw, &key_a, src.path()).await;
    console::search_form::search_from_form(&c, &mut gw, &key_a, src.path()).await;
    console::delivery_form::delivery_from_form(&c, &mut gw, &key_a, src.path()).await;
}

/// A budget the gateway refuses: its message next to the budget field, no run started.
async fn bad_form_starts_nothing(c: &Console, gw: &mut Gw, key: &str, src: &Path) {
    c.fill_new_run(src, "fix it", "-1", "").await;
    c.submit_new_run().await;
    let error = c.b.text_of("#budget-error").await;
    assert!(error.starts_with("budget_usd"), "budget error: {error:?}");
    let repo_kept =
        c.b.execute("return document.getElementById('repo').value")
            .await
            .unwrap();
    assert_eq!(
        repo_kept.as_str(),
        Some(src.to_str().unwrap()),
        "the form keeps its values"
    );
    c.shot("02-form-error").await;
    let runs = gw
        .list_runs(with_key(key, ListRunsRequest::default()))
        .await
        .expect("list")
        .into_inner()
        .runs;
    assert!(runs.is_empty(), "a refused form started {runs:?}");
}

/// Three forks from the form, with `<script>` in the prompt and a label; the run's id.
async fn launch_from_form(c: &Console, src: &Path) -> String {
    c.b.goto(&c.url("/runs")).await.unwrap();
    c.fill_new_run(src, XSS, "1", &format!("xss={XSS}")).await;
    c.submit_new_run().await;
    let run_id = c.launched_run_id().await;
    assert!(run_id.starts_with("run-team-a."), "{run_id}");
    run_id
}

/// The run page, opened while forks run, shows all three succeeded without a reload.
async fn forks_succeed_live(c: &Console, run_id: &str) {
    let b = &c.b;
    let first: Vec<String> = serde_json::from_value(
        b.execute("return Array.from(document.querySelectorAll('#forks tbody tr')).map(r => r.dataset.status)")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first.len(), 3, "fork rows: {first:?}");
    assert!(
        first.iter().any(|s| s != "succeeded"),
        "every fork had succeeded before the page opened: nothing left to see live ({first:?})"
    );
    // A reload would lose this.
    b.execute("window.__samePage = 'yes'; return true")
        .await
        .unwrap();
    b.wait_for(
        "return document.querySelectorAll('#forks tr[data-status=\"succeeded\"]').length === 3",
        Duration::from_secs(120),
    )
    .await
    .expect("three forks succeeded, live");
    assert_eq!(
        b.execute("return window.__samePage").await.unwrap(),
        "yes",
        "the page reloaded"
    );
    let patches = b
        .execute("return document.body.dataset.patches")
        .await
        .unwrap();
    assert!(
        patches.as_str().is_some_and(|p| p != "0"),
        "no SSE patch applied: {patches}"
    );
    b.wait_for(
        "return document.body.dataset.live === 'finished'",
        Duration::from_secs(60),
    )
    .await
    .expect("the live stream ends with the run");
    let summary = b.text_of("#run-summary").await;
    assert!(
        summary.contains("completed") && summary.contains("winner: fork"),
        "{summary}"
    );
    let prompt = b.text_of("pre.prompt").await;
    assert_eq!(prompt, XSS, "the prompt shown as text");
    c.assert_nothing_ran(&format!("run page {run_id}")).await;
    let chart = actions::chart_is_drawn(c).await;
    let img = c.shot("04-run").await;
    actions::assert_chart_visible(&img, chart);
}

/// A slow run steered from its page: forged POSTs refused; its live view through a
/// gateway restart; paused and resumed; its budget raised; cancelled.
async fn steer_from_page(c: &Console, mesh: &mut Mesh, gw: &mut Gw, key: &str, src: &Path) {
    let slow = gw
        .launch_run(with_key(
            key,
            tenant_calls::launch_req(src, "console-slow", "sleep 300"),
        ))
        .await
        .expect("slow launch")
        .into_inner()
        .run_id;
    for action in ["cancel", "pause", "budget"] {
        let forged = c
            .raw_post(
                &format!("/runs/{slow}/{action}"),
                Some(key),
                "csrf=not-the-token&amount=1",
            )
            .await;
        assert_eq!(
            forged.0, 403,
            "a {action} POST without the session's token: {}",
            forged.1
        );
    }
    let run = tenant_calls::get(gw, key, &slow).await.expect("slow run");
    assert_eq!(
        run.state,
        RunState::Running as i32,
        "cancelled by a forged POST"
    );

    c.b.goto(&c.url(&format!("/runs/{slow}"))).await.unwrap();
    *gw = actions::live_view_survives_a_gateway_restart(c, mesh, key, &slow).await;
    actions::pause_and_resume_from_page(c, gw, key, &slow).await;
    actions::raise_budget_from_page(c, gw, key, &slow).await;
    c.click_to_load("#cancel-run button").await;
    let run = wait_closed(gw, key, &slow, Duration::from_secs(90)).await;
    assert_eq!(run.state, RunState::Cancelled as i32, "{run:#?}");
    c.b.wait_for(
        "const s = document.querySelector('#run-summary .state'); return !!s && s.dataset.state === 'cancelled'",
        Duration::from_secs(60),
    )
    .await
    .expect("the page shows the run cancelled");
    c.shot("09-cancelled").await;
}
