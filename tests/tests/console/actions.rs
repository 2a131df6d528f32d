//! The run page's actions and live view under a restart, for e2e_console: the live
//! view reconnects when the gateway restarts; pause and resume from the page; a raise
//! of the budget, refused and then made; an admin tenant's key reads every tenant's
//! runs and changes none.

use super::{CHART_LINE, Console, assert_colour};
use crate::tenant_calls::{self, Gw, with_key};
use forkyard_proto::{
    Usd,
    gateway::v1::{PauseRunRequest, RunState},
};
use forkyard_tests::Mesh;
use std::time::Duration;

/// The run page's state word, once it is `state`.
pub async fn wait_state(c: &Console, state: &str, why: &str) {
    let script = format!(
        "const s = document.querySelector('#run-summary .state'); return !!s && s.dataset.state === '{state}'"
    );
    c.b.wait_for(&script, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{why}: the page never said {state}: {e}"));
}

/// The open run page's live view outlives a gateway restart: killed, the page says it
/// is reconnecting; back, a pause made through the API shows without a reload. Much of
/// this step is that pause: the first signal after the kill waits for Temporal to give
/// up on the dead gateway's sticky workflow queue (`FORKYARD_STICKY_TIMEOUT_SECS`, 3 s
/// in the test mesh).
pub async fn live_view_survives_a_gateway_restart(
    c: &Console,
    mesh: &mut Mesh,
    key: &str,
    run_id: &str,
) -> Gw {
    let b = &c.b;
    b.wait_for(
        "return document.body.dataset.live === 'open'",
        Duration::from_secs(30),
    )
    .await
    .expect("the live view connects");
    b.execute("window.__samePage = 'yes'; return true")
        .await
        .unwrap();
    // Killed, not stopped: a graceful stop drains open watches (the page's) for 30 s.
    mesh.kill9("gateway");
    b.wait_for(
        "return document.body.dataset.live === 'reconnecting'",
        Duration::from_secs(30),
    )
    .await
    .expect("the page notices the gateway gone");
    mesh.start_service("gateway").unwrap();
    mesh.wait_serving("gateway", Duration::from_secs(60))
        .await
        .expect("gateway back");
    let mut gw = Gw::new(mesh.channel("gateway").await.expect("gateway"));
    gw.pause_run(with_key(
        key,
        PauseRunRequest {
            run_id: run_id.to_owned(),
        },
    ))
    .await
    .expect("pause");
    wait_state(c, "paused", "paused through the API after the restart").await;
    let v = b
        .execute("return [window.__samePage, Number(document.body.dataset.opens) > 1]")
        .await
        .unwrap();
    assert_eq!(
        v,
        serde_json::json!(["yes", true]),
        "[same page, reconnected]"
    );
    gw
}

/// Resume, pause and resume again with the page's buttons.
pub async fn pause_and_resume_from_page(c: &Console, gw: &mut Gw, key: &str, run_id: &str) {
    for (button, state) in [
        ("#resume-run button", "running"),
        ("#pause-run button", "paused"),
        ("#resume-run button", "running"),
    ] {
        c.click_to_load(button).await;
        wait_state(c, state, button).await;
        let run = tenant_calls::get(gw, key, run_id).await.expect("run");
        let want = if state == "paused" {
            RunState::Paused
        } else {
            RunState::Running
        };
        assert_eq!(run.state, want as i32, "after {button}");
    }
}

/// A bad amount: the gateway's message next to the field, the budget unchanged. A good
/// one: the page shows the new budget.
pub async fn raise_budget_from_page(c: &Console, gw: &mut Gw, key: &str, run_id: &str) {
    let before = tenant_calls::get(gw, key, run_id)
        .await
        .expect("run")
        .budget_micros;
    c.b.fill("#amount", "-1").await.unwrap();
    c.click_to_load("#raise-budget button").await;
    let said = c.b.text_of("#amount-error").await;
    assert!(said.starts_with("amount_usd"), "a bad raise: {said:?}");
    let kept =
        c.b.execute("return document.getElementById('amount').value")
            .await
            .unwrap();
    assert_eq!(kept, "-1", "the field keeps what was typed");
    let after = tenant_calls::get(gw, key, run_id).await.expect("run");
    assert_eq!(
        after.budget_micros, before,
        "a refused raise changed the budget"
    );
    c.shot("08-raise-refused").await;

    c.b.fill("#amount", "2.5").await.unwrap();
    c.click_to_load("#raise-budget button").await;
    let raised = tenant_calls::get(gw, key, run_id).await.expect("run");
    assert_eq!(raised.budget_micros, before + 2_500_000);
    let label = c.b.text_of("#run-summary .budget label").await;
    let want = Usd::from_micros(raised.budget_micros).to_string();
    assert!(
        label.ends_with(&format!("of {want}")),
        "budget label {label:?}, want {want}"
    );
    assert!(c.b.find_all("#amount-error").await.unwrap().is_empty());
}

/// The run page's cost chart: an SVG with the spend drawn as a path, one step per
/// settled fork, visible in the screenshot (its line's colour).
pub async fn chart_is_drawn(c: &Console) -> (f64, f64, f64, f64) {
    let v =
        c.b.execute(
            "const s = document.querySelector('#cost-chart svg'); \
             const p = s && s.querySelector('path.spend'); \
             return [!!s, !!p && (p.getAttribute('d').match(/V/g) || []).length]",
        )
        .await
        .unwrap();
    assert_eq!(
        v,
        serde_json::json!([true, 3]),
        "[svg, one step per settled fork]"
    );
    c.viewport_rect("#cost-chart svg").await
}

pub fn assert_chart_visible(img: &forkyard_tests::png::Image, rect: (f64, f64, f64, f64)) {
    assert_colour(img, rect, CHART_LINE, "cost chart");
}

/// An admin tenant's key (FORKYARD_ADMIN_TENANTS) reads every tenant's runs through the
/// console, as through the gateway, and changes none of them: its runs page lists
/// team-a's run with its tenant, the run and fork pages open, and a pause or a raise is
/// refused with the gateway's word, the run untouched.
pub async fn admin_key_reads_every_tenant(c: &Console, admin_key: &str, run_id: &str) {
    for path in [format!("/runs/{run_id}"), format!("/runs/{run_id}/forks/1")] {
        let (status, body) = c.raw(&path, Some(admin_key), None).await;
        assert_eq!(status, 200, "the admin's {path}: {body}");
        assert!(body.contains(run_id), "the admin's {path}: {body}");
    }
    let (status, body) = c.raw("/runs", Some(admin_key), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(run_id),
        "the admin's runs page lacks {run_id}"
    );
    // Filtered by tenant, the listing names whose runs they are.
    let (status, body) = c.raw("/runs?tenant=team-a", Some(admin_key), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("<td class=\"tenant\">team-a</td>"),
        "the admin's runs page names the run's tenant: {body}"
    );
    for action in ["pause", "budget"] {
        let (status, body) = c
            .raw_post(
                &format!("/runs/{run_id}/{action}"),
                Some(admin_key),
                &format!("csrf={}&amount=1", "a".repeat(64)),
            )
            .await;
        assert_ne!(status, 303, "the admin's {action} went through: {body}");
        assert!(
            body.contains("changes only its own"),
            "the admin's {action}: {body}"
        );
    }
}

/// A phone-sized window (390 × 844): the runs, run and fork pages fit its width (wide
/// tables and diffs scroll inside their own boxes, not the page) and are not blank.
pub async fn pages_fit_a_phone(c: &Console, run_id: &str) {
    c.b.window_size(390, 844).await.expect("resize");
    for (path, shot) in [
        ("/runs".to_owned(), "09-phone-runs"),
        (format!("/runs/{run_id}"), "10-phone-run"),
        (format!("/runs/{run_id}/forks/1"), "11-phone-fork"),
    ] {
        c.b.goto(&c.url(&path)).await.unwrap();
        let overflow =
            c.b.execute("return document.documentElement.scrollWidth - window.innerWidth")
                .await
                .unwrap();
        if !overflow.as_f64().is_some_and(|o| o <= 1.0) {
            // What sticks out, to say which rule is missing.
            let wide = c.b.execute(
                "const out = e => e.getBoundingClientRect().right > window.innerWidth + 1; return [...document.querySelectorAll('body *')].filter(e => out(e) && !out(e.parentElement)).slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).join(', ')",
            )
            .await
            .unwrap();
            panic!("{path} is {overflow} px wider than a phone's window: {wide}");
        }
        c.shot(shot).await;
    }
    c.b.window_size(1280, 1000).await.expect("resize back");
}
