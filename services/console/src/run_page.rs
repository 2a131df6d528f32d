//! `/runs/<id>`: a run's forks (status and phase, duration, model and sandbox cost,
//! tokens, verify, diffstat, backend), its budget, ranking and winner, kept live by
//! `/runs/<id>/events`; its cost over time, its fork tree, and the forms of its
//! actions (`run_forms`, done by `run_actions`).

use crate::{
    AppState, ConsoleError, chart, fork_tree, format, gateway,
    layout::{csrf_field, page as layout},
    run_forms::{self, Refused},
    runs_page,
    session::Session,
};
use axum::{
    Extension,
    extract::{Path, State},
};
use forkyard_proto::{
    common::v1::ForkResult,
    gateway::v1::{GetRunRequest, Run},
};
use maud::{Markup, html};

pub async fn get_run(
    state: &AppState,
    session: &Session,
    run_id: &str,
) -> Result<Run, ConsoleError> {
    let req = GetRunRequest {
        run_id: run_id.to_owned(),
    };
    let run = state
        .gateway
        .client()
        .get_run(gateway::unary(session.key.as_ref(), req)?)
        .await
        .map_err(|s| match s.code() {
            // Named by the page, not by the gateway's wording.
            tonic::Code::NotFound => ConsoleError::NotFound(format!("run {run_id}")),
            _ => s.into(),
        })?;
    Ok(run.into_inner())
}

pub async fn page(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
) -> Result<Markup, ConsoleError> {
    render(&state, &session, &run_id, &Refused::default()).await
}

/// The run page, with `refused`'s messages next to their fields.
pub async fn render(
    state: &AppState,
    session: &Session,
    run_id: &str,
    refused: &Refused,
) -> Result<Markup, ConsoleError> {
    let run = get_run(state, session, run_id).await?;
    let now = format::now_ms();
    let spec = run.spec.clone().unwrap_or_default();
    let body = html! {
        p.crumbs { a href="/runs" { "Runs" } " / " (run_id) }
        h1 { "Run " (run_id) }
        dl.spec {
            dt { "Repository" } dd { code { (spec.repo) } }
            dt { "Agent" } dd { (spec.agent.as_ref().map(|a| a.driver.as_str()).unwrap_or("—"))
                @if let Some(m) = spec.agent.as_ref().map(|a| &a.model).filter(|m| !m.is_empty()) { " · " (m) } }
            dt { "Verify" } dd { @if spec.verify_command.is_empty() { "—" } @else { code { (spec.verify_command) } } }
            dt { "Labels" } dd { (runs_page::labels(&run)) }
            dt { "Prompt" } dd { pre.prompt { (spec.prompt) } }
        }
        @if let Some(e) = refused.errors.get("") { p #action-error .field-error role="alert" { (e) } }
        (summary(&run, session))
        @if format::run_live(run.state) { (run_forms::raise_form(&run, session, refused)) }
        section #cost aria-labelledby="cost-title" {
            h2 #cost-title { "Cost over time" }
            (chart::render(&run, now))
        }
        (fork_tree::render(&run))
        h2 { "Forks" }
        // In a box of its own that scrolls sideways on a narrow window, not the page.
        div.scroll { table #forks data-events=(format!("/runs/{run_id}/events")) {
            thead { tr {
                th { "Fork" } th { "Status" } th { "Phase" } th { "Duration" }
                th { "Model cost" } th { "Sandbox cost" } th { "Tokens in / out" }
                th { "Verify" } th { "Diff" } th { "Backend" } th { "Actions" }
            } }
            tbody { @for f in &run.forks { (fork_row(&run, f, now, session)) } }
        } }
        p.compare-hint { "Compare two forks: open one and add " code { "?compare=<n>" } "." }
    };
    Ok(layout(&format!("Run {run_id}"), Some(session), body))
}

/// The run's state, counts, search round, budget bar, ranking and winner, and the cancel
/// button while the run can be cancelled: one element, redrawn live.
pub fn summary(run: &Run, session: &Session) -> Markup {
    let (cost, budget) = (run.cost_micros, run.budget_micros.max(0));
    let winner = run.winner;
    html! {
        section #run-summary aria-live="polite" {
            p { "State: " strong.state data-state=(format::run_state(run.state)) { (format::run_state(run.state)) }
                " · forks done " (runs_page::forks_done(run))
                " · " (run.forks_succeeded) " succeeded, " (run.forks_failed) " failed, "
                (run.forks_running) " running, " (run.forks_pending) " pending" }
            @if !run.error.is_empty() { p.error { (run.error) } }
            @if let Some(search) = run.spec.as_ref().and_then(|s| s.search.as_ref()) {
                p.search { "Search: round " strong #search-round { (run.search_round) } " of " (search.rounds)
                    ", keeping " (search.keep) " with " (search.branches) " branches each"
                    @if !run.search_end.is_empty() { " · ended early: " (run.search_end) } }
            }
            div.budget {
                label for="budget-bar" { "Budget: " (format::usd(cost)) " of " (format::usd(budget)) }
                meter #budget-bar min="0" max=(budget) value=(cost.min(budget)) high=(budget * 9 / 10) {
                    (format::usd(cost)) " of " (format::usd(budget))
                }
            }
            p.ranking { "Ranking: "
                @if run.ranking.is_empty() { "none yet" }
                @for (i, n) in run.ranking.iter().enumerate() {
                    @if i > 0 { " › " }
                    a href=(format!("/runs/{}/forks/{n}", run.run_id)) { "fork " (n) }
                }
                @if winner > 0 { " · winner: " strong #winner { "fork " (winner) } }
            }
            @if format::run_live(run.state) { (run_forms::buttons(run, session)) }
        }
    }
}

/// One fork's row (id `fork-<n>`), redrawn live.
pub fn fork_row(run: &Run, f: &ForkResult, now: i64, session: &Session) -> Markup {
    let (run_id, n) = (&run.run_id, f.fork);
    let status = format::fork_status(f.status);
    let usage = f.usage.unwrap_or_default();
    let diff = f.diffstat.unwrap_or_default();
    html! {
        tr id=(format!("fork-{n}")) data-status=(status) {
            td { a href=(format!("/runs/{run_id}/forks/{n}")) { "fork " (n) } }
            td.status { span class=(format!("badge {}", status.replace(' ', "-"))) { (status) } }
            td { (f.phase) @if !f.error.is_empty() { " " span.error title=(f.error) { "(error)" } } }
            td { (format::span(f.started_unix_ms, f.finished_unix_ms, now)) }
            td { (format::usd(f.model_cost_micros)) }
            td { (format::usd(f.sandbox_cost_micros)) }
            td { (usage.input_tokens) " / " (usage.output_tokens) }
            td { (format::verify(f.verify)) }
            td { @if diff.files_changed > 0 {
                    span.add { "+" (diff.insertions) } " " span.del { "−" (diff.deletions) }
                    " in " (diff.files_changed) " files"
                } @else { "—" } }
            td { @if f.backend.is_empty() { "—" } @else { (f.backend) } }
            td { @if format::run_live(run.state) && !format::fork_done(f.status) {
                    form.inline method="post" action=(format!("/runs/{run_id}/forks/{n}/cancel")) {
                        (csrf_field(session))
                        button.danger type="submit" aria-label=(format!("Cancel fork {n}")) { "Cancel" }
                    }
                } }
        }
    }
}
