//! `/runs/<id>/forks/<n>`: one fork's patch as a diff, its verify output, agent output,
//! error and transcript, and the forms to publish or branch it (`fork_actions`);
//! `?compare=<m>` puts fork m's patch beside it.

use crate::{
    AppState, ConsoleError, diff, fork_forms, format, gateway,
    layout::page as layout,
    new_run_form::FieldErrors,
    run_page::{self, get_run},
    session::Session,
    transcript,
};
use axum::{
    Extension,
    extract::{Path, Query, State},
};
use forkyard_proto::{
    common::v1::ForkResult,
    gateway::v1::{GetForkResultRequest, Run},
};
use maud::{Markup, html};

#[derive(Debug, Default, serde::Deserialize)]
pub struct Compare {
    #[serde(default)]
    compare: Option<String>,
}

pub async fn page(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path((run_id, fork)): Path<(String, String)>,
    Query(q): Query<Compare>,
) -> Result<Markup, ConsoleError> {
    let compare = q.compare.as_deref().filter(|c| !c.is_empty());
    render(
        &state,
        &session,
        &run_id,
        &fork,
        compare,
        &FieldErrors::new(),
    )
    .await
}

/// The fork page (or two forks side by side), with `errors` next to the fields of its
/// forms (a refused publish or branch).
pub async fn render(
    state: &AppState,
    session: &Session,
    run_id: &str,
    fork: &str,
    compare: Option<&str>,
    errors: &FieldErrors,
) -> Result<Markup, ConsoleError> {
    // The run first: another tenant's (or an unknown) run is a 404 before any fork.
    let run = get_run(state, session, run_id).await?;
    let n = fork_number(&run, fork)?;
    let other = match compare {
        Some(m) => Some(fork_number(&run, m)?),
        None => None,
    };
    let result = fork_result(state, session, run_id, n).await?;
    let body = match other {
        Some(m) => {
            let right = fork_result(state, session, run_id, m).await?;
            side_by_side(&run, &result, &right)
        }
        None => single(&run, &result, session, errors),
    };
    Ok(layout(&format!("{run_id} fork {n}"), Some(session), body))
}

/// `text` as one of the run's fork numbers, else a 404.
fn fork_number(run: &Run, text: &str) -> Result<u32, ConsoleError> {
    text.parse::<u32>()
        .ok()
        .filter(|n| *n >= 1 && (*n as usize) <= run.forks.len())
        .ok_or_else(|| ConsoleError::NotFound(format!("fork {text} of run {}", run.run_id)))
}

async fn fork_result(
    state: &AppState,
    session: &Session,
    run_id: &str,
    fork: u32,
) -> Result<ForkResult, ConsoleError> {
    let req = GetForkResultRequest {
        run_id: run_id.to_owned(),
        fork,
    };
    let result = state
        .gateway
        .client()
        .get_fork_result(gateway::unary(session.key.as_ref(), req)?)
        .await?;
    Ok(result.into_inner())
}

fn crumbs(run: &Run, title: Markup) -> Markup {
    html! {
        p.crumbs { a href="/runs" { "Runs" } " / " a href=(format!("/runs/{}", run.run_id)) { (run.run_id) } " / " (title) }
    }
}

fn single(run: &Run, f: &ForkResult, session: &Session, errors: &FieldErrors) -> Markup {
    let now = format::now_ms();
    html! {
        (crumbs(run, html! { "fork " (f.fork) }))
        h1 { "Fork " (f.fork) " of " (run.run_id) }
        @if f.parent_fork > 0 {
            p #parent { "Branched from "
                a href=(format!("/runs/{}/forks/{}", run.run_id, f.parent_fork)) { "fork " (f.parent_fork) }
                @if f.branch_turn > 0 { " after its model turn " (f.branch_turn) ", while it ran" } @else { " at its end" }
                " (depth " (f.depth) ")" }
        }
        div.scroll { table #fork-row { tbody { (run_page::fork_row(run, f, now, session)) } } }
        @if !f.error.is_empty() {
            section #fork-error { h2 { "Error" } p.error role="alert" { "During " (phase(f)) ": " (f.error) } }
        }
        nav.compare aria-label="compare" { "Compare with: "
            @for other in run.forks.iter().filter(|o| o.fork != f.fork) {
                a href=(format!("/runs/{}/forks/{}?compare={}", run.run_id, f.fork, other.fork)) { "fork " (other.fork) } " "
            }
        }
        h2 { "Patch" @if f.patch_truncated { " (truncated)" } }
        (diff::render(&f.patch, "patch"))
        h2 { "Verify" }
        p { (format::verify(f.verify))
            @if f.verify_duration_ms > 0 { " · exit " (f.verify_exit_code) " · " (format::duration_ms(f.verify_duration_ms)) } }
        @if !f.verify_output_tail.is_empty() { pre #verify-output .output { (f.verify_output_tail) } }
        h2 { "Agent output" }
        @if f.agent_output_tail.is_empty() { p { "—" } } @else { pre #agent-output .output { (f.agent_output_tail) } }
        (fork_forms::forms(run, f, session, errors))
        section aria-labelledby="transcript-title" {
            h2 #transcript-title { "Transcript" }
            (transcript::render(&f.transcript))
        }
    }
}

/// Where a failed fork was: its last phase, else "its run".
fn phase(f: &ForkResult) -> &str {
    if f.phase.is_empty() {
        "the fork"
    } else {
        &f.phase
    }
}

fn side_by_side(run: &Run, left: &ForkResult, right: &ForkResult) -> Markup {
    let side = |f: &ForkResult, id: &str| {
        html! {
            section.side aria-label=(format!("fork {}", f.fork)) {
                h2 { a href=(format!("/runs/{}/forks/{}", run.run_id, f.fork)) { "Fork " (f.fork) } }
                p { (format::fork_status(f.status)) " · verify " (format::verify(f.verify))
                    " · " (format::usd(f.cost_micros)) }
                (diff::render(&f.patch, id))
            }
        }
    };
    html! {
        (crumbs(run, html! { "fork " (left.fork) " vs fork " (right.fork) }))
        h1 { "Fork " (left.fork) " and fork " (right.fork) }
        div #compare .compare { (side(left, "left")) (side(right, "right")) }
    }
}
