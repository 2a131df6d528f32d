//! A fork's actions from its page: publish it (push its branch, and open a pull request
//! if asked: `PublishFork`, once its run has ended) and branch it (`BranchFork`: count
//! new forks continuing from its end, while the run's branch window is open). POSTs with
//! the session's CSRF token, made with the visitor's key. Done: the fork page (publish,
//! showing where it went) or the run page (branch, its new forks live). Refused: the
//! fork page again with the gateway's message next to the field it names.

use crate::{
    AppState, ConsoleError, fork_page, format, gateway,
    layout::csrf_field,
    new_run_form::FieldErrors,
    run_actions::is_refusal,
    session::{Session, parse_form},
};
use axum::{
    Extension,
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::{BranchForkRequest, PublishForkRequest, Run},
};
use maud::{Markup, html};

/// Where the fork was delivered, and the forms its state allows.
pub fn forms(run: &Run, f: &ForkResult, session: &Session, errors: &FieldErrors) -> Markup {
    let base = format!("/runs/{}/forks/{}", run.run_id, f.fork);
    let publishable = f.status == ForkStatus::Succeeded as i32 && !format::run_live(run.state);
    let branch_window = run.spec.as_ref().is_some_and(|s| s.branch_window_secs > 0);
    let branchable = branch_window && format::run_live(run.state) && format::fork_done(f.status);
    html! {
        @if let Some(d) = &f.delivered {
            section #delivered { h2 { "Delivered" }
                p { "Branch " code { (d.branch) } @if !d.commit.is_empty() { " at " code { (d.commit) } }
                    @if !d.remote.is_empty() { " on " code { (d.remote) } } }
                @if is_web_url(&d.pull_request_url) {
                    p { "Pull request: " a href=(d.pull_request_url) rel="noreferrer" { (d.pull_request_url) } } }
                @if !d.error.is_empty() { p.error { (d.error) } }
            }
        } @else if publishable {
            form #publish .actions method="post" action=(format!("{base}/publish")) {
                (csrf_field(session))
                label { input type="checkbox" name="pull_request" value="on"; " open a pull request" }
                label { input type="checkbox" name="draft" value="on"; " as a draft" }
                button type="submit" { "Push this fork" }
                (error("publish", errors))
            }
        }
        @if branchable {
            form #branch .actions method="post" action=(format!("{base}/branch")) novalidate {
                (csrf_field(session))
                label for="branch-count" { "Branches" }
                input #branch-count type="number" name="count" min="1" value="1" size="3"
                    aria-describedby=[errors.contains_key("count").then_some("count-error")];
                label for="branch-prompt" { "Next prompt" }
                input #branch-prompt type="text" name="prompt" placeholder="empty: the run's prompt again"
                    aria-describedby=[errors.contains_key("prompt").then_some("prompt-error")];
                button type="submit" { "Branch" }
                (error("count", errors)) (error("prompt", errors)) (error("branch", errors))
            }
        }
    }
}

/// Only a web address becomes a link (never `javascript:` or the like).
fn is_web_url(url: &str) -> bool {
    url.starts_with("https://") || url.starts_with("http://")
}

fn error(name: &str, errors: &FieldErrors) -> Markup {
    html! {
        @if let Some(e) = errors.get(name) {
            p.field-error id=(format!("{name}-error")) role="alert" { (e) }
        }
    }
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct PublishForm {
    csrf: String,
    pull_request: String,
    draft: String,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct BranchForm {
    csrf: String,
    count: String,
    prompt: String,
}

pub async fn publish(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path((run_id, fork)): Path<(String, u32)>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let form: PublishForm = parse_form(&body)?;
    session.check_csrf(&form.csrf)?;
    let req = PublishForkRequest {
        run_id: run_id.clone(),
        fork,
        pull_request: form.pull_request == "on",
        draft: form.draft == "on",
        ..Default::default()
    };
    // A push and a pull request take their time: no unary deadline.
    let req = gateway::request(session.key.as_ref(), req)?;
    let done = state.gateway.client().publish_fork(req).await;
    tracing::info!(run_id, fork, ok = done.is_ok(), "publish from the console");
    let back = format!("/runs/{run_id}/forks/{fork}");
    match done {
        Ok(_) => Ok(Redirect::to(&back).into_response()),
        Err(s) => refused(&state, &session, &run_id, fork, s, |_| "publish").await,
    }
}

pub async fn branch(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path((run_id, fork)): Path<(String, u32)>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let form: BranchForm = parse_form(&body)?;
    session.check_csrf(&form.csrf)?;
    let Ok(count) = form.count.trim().parse::<u32>() else {
        let errors =
            FieldErrors::from([("count", format!("count: {:?} is not a number", form.count))]);
        let page =
            fork_page::render(&state, &session, &run_id, &fork.to_string(), None, &errors).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    };
    let req = BranchForkRequest {
        run_id: run_id.clone(),
        fork,
        count,
        prompt: form.prompt,
    };
    let done = state
        .gateway
        .client()
        .branch_fork(gateway::unary(session.key.as_ref(), req)?)
        .await;
    tracing::info!(run_id, fork, ok = done.is_ok(), "branch from the console");
    match done {
        Ok(_) => Ok(Redirect::to(&format!("/runs/{run_id}")).into_response()),
        Err(s) => refused(&state, &session, &run_id, fork, s, branch_field).await,
    }
}

/// The branch form's field a gateway message names (`count: …`, `prompt: …`).
fn branch_field(message: &str) -> &'static str {
    match message.split(':').next().unwrap_or_default().trim() {
        "count" => "count",
        "prompt" => "prompt",
        _ => "branch",
    }
}

async fn refused(
    state: &AppState,
    session: &Session,
    run_id: &str,
    fork: u32,
    s: tonic::Status,
    field: impl Fn(&str) -> &'static str,
) -> Result<Response, ConsoleError> {
    if !is_refusal(s.code()) {
        return Err(s.into());
    }
    let errors = FieldErrors::from([(field(s.message()), s.message().to_owned())]);
    let page = fork_page::render(state, session, run_id, &fork.to_string(), None, &errors).await?;
    let status = if s.code() == tonic::Code::InvalidArgument {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::CONFLICT
    };
    Ok((status, page).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_messages_land_on_their_field() {
        assert_eq!(branch_field("count: must be at least 1"), "count");
        assert_eq!(branch_field("prompt: contains a NUL byte"), "prompt");
        assert_eq!(branch_field("run r is closed"), "branch");
    }

    #[test]
    fn forms_follow_the_forks_and_runs_state() {
        use forkyard_proto::gateway::v1::{RunSpec, RunState};
        let s = Session {
            key: None,
            csrf: "t".into(),
            secure: false,
        };
        let mut run = Run {
            run_id: "r".into(),
            state: RunState::Completed as i32,
            ..Default::default()
        };
        let ok = ForkResult {
            fork: 1,
            status: ForkStatus::Succeeded as i32,
            ..Default::default()
        };
        let html = forms(&run, &ok, &s, &FieldErrors::new()).into_string();
        assert!(
            html.contains("id=\"publish\"") && !html.contains("id=\"branch\""),
            "{html}"
        );
        run.state = RunState::Running as i32;
        run.spec = Some(RunSpec {
            branch_window_secs: 60,
            ..Default::default()
        });
        let html = forms(&run, &ok, &s, &FieldErrors::new()).into_string();
        assert!(
            !html.contains("id=\"publish\"") && html.contains("id=\"branch\""),
            "{html}"
        );
    }
}
