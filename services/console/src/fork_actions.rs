//! A fork's actions from its page: publish it (push its branch, and open a pull request
//! if asked: `PublishFork`, once its run has ended) and branch it (`BranchFork`: count
//! new forks continuing from its end, while the run's branch window is open). POSTs with
//! the session's CSRF token, made with the visitor's key. Done: the fork page (publish,
//! showing where it went) or the run page (branch, its new forks live). Refused: the
//! fork page again with the gateway's message next to the field it names.

use crate::{
    AppState, ConsoleError, fork_page, gateway,
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
use forkyard_proto::gateway::v1::{BranchForkRequest, PublishForkRequest};

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
}
