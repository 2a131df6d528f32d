//! `/runs`: the caller's runs (state, forks done of total, cost of budget, age, labels),
//! filtered by state and label, a page at a time; and the new-run form.

use crate::{
    AppState, ConsoleError, format, gateway,
    layout::page as layout,
    new_run_form::{FieldErrors, NewRunForm},
    new_run_view,
    session::Session,
};
use axum::{
    Extension,
    extract::{Query, State},
};
use forkyard_proto::gateway::v1::{GetRunRequest, ListRunsRequest, Run, RunState, RunSummary};
use maud::{Markup, html};
use std::collections::HashMap;

const PAGE_SIZE: u32 = 25;

/// The states a visitor can filter by, as the query names them.
const STATES: &[(&str, RunState)] = &[
    ("running", RunState::Running),
    ("paused", RunState::Paused),
    ("awaiting-budget", RunState::AwaitingBudget),
    ("completed", RunState::Completed),
    ("failed", RunState::Failed),
    ("cancelled", RunState::Cancelled),
    ("timed-out", RunState::TimedOut),
    ("terminated", RunState::Terminated),
];

#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub state: String,
    /// `key=value`.
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub page: String,
    /// An admin tenant's filter: one tenant's runs (the gateway refuses anyone else's).
    #[serde(default)]
    pub tenant: String,
}

pub async fn page(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Query(filter): Query<Filter>,
) -> Result<Markup, ConsoleError> {
    render(
        &state,
        &session,
        &filter,
        &NewRunForm::blank(),
        &FieldErrors::new(),
    )
    .await
}

/// The runs page, with the new-run form as given (after a refused launch: its values
/// and the gateway's message next to the field it names).
pub async fn render(
    state: &AppState,
    session: &Session,
    filter: &Filter,
    form: &NewRunForm,
    errors: &FieldErrors,
) -> Result<Markup, ConsoleError> {
    let (runs, next) = list(state, session, filter).await?;
    let now = format::now_ms();
    // Whose run each is matters once a listing spans tenants (an admin's).
    let tenants = !filter.tenant.is_empty()
        || runs
            .iter()
            .any(|(s, _)| runs.first().is_some_and(|(f, _)| f.tenant != s.tenant));
    let body = html! {
        h1 { "Runs" }
        (filter_form(filter))
        @if runs.is_empty() {
            p #no-runs { "No runs" @if !filter.state.is_empty() || !filter.label.is_empty() { " match this filter" } "." }
        } @else {
            div.scroll {
            table #runs {
                thead { tr {
                    th { "Run" } @if tenants { th { "Tenant" } } th { "State" } th { "Forks done" }
                    th { "Cost of budget" } th { "Age" } th { "Labels" }
                } }
                tbody { @for (summary, run) in &runs { (row(summary, run.as_ref(), now, tenants)) } }
            }
            }
        }
        @if let Some(token) = next {
            p { a #next-page href=(next_href(filter, &token)) { "Next page →" } }
        }
        (new_run_view::form(session, form, errors))
    };
    Ok(layout("Runs", Some(session), body))
}

async fn list(
    state: &AppState,
    session: &Session,
    filter: &Filter,
) -> Result<(Vec<(RunSummary, Option<Run>)>, Option<String>), ConsoleError> {
    let state_filter = match filter.state.as_str() {
        "" => RunState::Unspecified,
        s => STATES
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, st)| *st)
            .ok_or_else(|| ConsoleError::BadRequest(format!("state: unknown state {s:?}")))?,
    };
    let labels: HashMap<String, String> = filter
        .label
        .split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .into_iter()
        .collect();
    let req = ListRunsRequest {
        page_size: PAGE_SIZE,
        page_token: filter.page.clone(),
        state: state_filter as i32,
        labels,
        tenant: filter.tenant.trim().to_owned(),
    };
    let key = session.key.as_ref();
    let listed = state
        .gateway
        .client()
        .list_runs(gateway::unary(key, req)?)
        .await?
        .into_inner();
    // A summary has no forks, cost or labels: each run is read, all at once.
    let reads = listed.runs.into_iter().map(|summary| async move {
        let req = GetRunRequest {
            run_id: summary.run_id.clone(),
        };
        let run = match gateway::unary(key, req) {
            Ok(r) => state.gateway.client().get_run(r).await.ok(),
            Err(_) => None,
        };
        (summary, run.map(tonic::Response::into_inner))
    });
    let runs = futures::future::join_all(reads).await;
    let next = Some(listed.next_page_token).filter(|t| !t.is_empty());
    Ok((runs, next))
}

fn filter_form(filter: &Filter) -> Markup {
    html! {
        form.filter method="get" action="/runs" role="search" {
            label for="state" { "State" }
            select #state name="state" {
                option value="" selected[filter.state.is_empty()] { "any" }
                @for (name, _) in STATES {
                    option value=(name) selected[filter.state == *name] { (name) }
                }
            }
            label for="label" { "Label" }
            input #label type="text" name="label" placeholder="key=value" value=(filter.label);
            label for="tenant" { "Tenant" }
            input #tenant type="text" name="tenant" placeholder="any (admins)" value=(filter.tenant);
            button type="submit" { "Filter" }
        }
    }
}

fn row(summary: &RunSummary, run: Option<&Run>, now: i64, tenant: bool) -> Markup {
    let id = &summary.run_id;
    html! {
        tr data-run=(id) {
            td { a href=(format!("/runs/{id}")) { (id) } }
            @if tenant { td.tenant { (summary.tenant) } }
            td.state { (format::run_state(summary.state)) }
            @if let Some(run) = run {
                td { (forks_done(run)) }
                td { (format::usd(run.cost_micros)) " of " (format::usd(run.budget_micros)) }
            } @else {
                td { "—" } td { "—" }
            }
            td { (format::age(summary.started_unix_ms, now)) }
            td.labels { @if let Some(run) = run { (labels(run)) } }
        }
    }
}

/// "2 / 3": forks that ended (however they ended) of the run's forks.
pub fn forks_done(run: &Run) -> String {
    let done = run
        .forks
        .iter()
        .filter(|f| format::fork_done(f.status))
        .count();
    // A run's branches and search rounds add forks to the launch's: what it holds now
    // (a listing may carry no forks, only the spec).
    let launched = run.spec.as_ref().map_or(0, |s| s.forks as usize);
    let total = launched.max(run.forks.len());
    format!("{done} / {total}")
}

/// The run's labels, sorted, each as `key=value`.
pub fn labels(run: &Run) -> Markup {
    let mut pairs: Vec<_> = run
        .spec
        .as_ref()
        .map(|s| s.labels.iter().collect())
        .unwrap_or_default();
    pairs.sort();
    html! { @for (k, v) in pairs { span.label { (k) "=" (v) } " " } }
}

fn next_href(filter: &Filter, token: &str) -> String {
    let query = serde_urlencoded::to_string([
        ("state", filter.state.as_str()),
        ("label", filter.label.as_str()),
        ("tenant", filter.tenant.as_str()),
        ("page", token),
    ])
    .unwrap_or_default();
    format!("/runs?{query}")
}
