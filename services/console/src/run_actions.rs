//! A run's actions from its page: pause, resume, cancel it, cancel one fork, raise its
//! budget. Each is a POST carrying the session's CSRF token, made with the visitor's own
//! key, so the gateway decides what they may do. Done: back to the run page (303), which
//! shows the run's new state and stays live. Refused: the run page again (409 or 422)
//! with the gateway's message next to the field it is about, nothing changed.

use crate::{
    AppState, ConsoleError, gateway,
    login::CsrfOnly,
    new_run_form::FieldErrors,
    run_forms::Refused,
    run_page,
    session::{Session, parse_form},
};
use axum::{
    Extension,
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use forkyard_proto::gateway::v1::{
    CancelForkRequest, CancelRunRequest, PauseRunRequest, RaiseBudgetRequest, ResumeRunRequest,
};

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct RaiseForm {
    csrf: String,
    amount: String,
}

/// A refusal of the action itself (bad input, the run's state, the tenant's rights),
/// as opposed to the gateway failing: shown on the page.
pub fn is_refusal(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        InvalidArgument | FailedPrecondition | PermissionDenied | ResourceExhausted | OutOfRange
    )
}

/// The outcome of an action: the run page on success, or again with the refusal.
async fn answer(
    state: &AppState,
    session: &Session,
    run_id: &str,
    result: Result<(), tonic::Status>,
    field: &'static str,
    amount: String,
) -> Result<Response, ConsoleError> {
    match result {
        Ok(()) => Ok(Redirect::to(&format!("/runs/{run_id}")).into_response()),
        Err(s) if is_refusal(s.code()) => {
            let status = if s.code() == tonic::Code::InvalidArgument {
                StatusCode::UNPROCESSABLE_ENTITY
            } else {
                StatusCode::CONFLICT
            };
            let refused = Refused {
                errors: FieldErrors::from([(field, s.message().to_owned())]),
                amount,
            };
            let page = run_page::render(state, session, run_id, &refused).await?;
            Ok((status, page).into_response())
        }
        Err(s) if s.code() == tonic::Code::NotFound => {
            Err(ConsoleError::NotFound(format!("run {run_id}")))
        }
        Err(s) => Err(s.into()),
    }
}

/// A plain action's outcome: logged, then the run page (its refusal above the actions).
async fn done<T>(
    state: &AppState,
    session: &Session,
    run_id: &str,
    action: &str,
    result: Result<T, tonic::Status>,
) -> Result<Response, ConsoleError> {
    tracing::info!(
        run_id,
        action,
        ok = result.is_ok(),
        "run action from the console"
    );
    answer(state, session, run_id, result.map(drop), "", String::new()).await
}

pub async fn pause(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    session.check_csrf(&parse_form::<CsrfOnly>(&body)?.csrf)?;
    let req = PauseRunRequest {
        run_id: run_id.clone(),
    };
    let req = gateway::unary(session.key.as_ref(), req)?;
    let result = state.gateway.client().pause_run(req).await;
    done(&state, &session, &run_id, "pause", result).await
}

pub async fn resume(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    session.check_csrf(&parse_form::<CsrfOnly>(&body)?.csrf)?;
    let req = ResumeRunRequest {
        run_id: run_id.clone(),
    };
    let req = gateway::unary(session.key.as_ref(), req)?;
    let result = state.gateway.client().resume_run(req).await;
    done(&state, &session, &run_id, "resume", result).await
}

pub async fn cancel(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    session.check_csrf(&parse_form::<CsrfOnly>(&body)?.csrf)?;
    let req = CancelRunRequest {
        run_id: run_id.clone(),
        reason: "cancelled from the console".into(),
    };
    let req = gateway::unary(session.key.as_ref(), req)?;
    let result = state.gateway.client().cancel_run(req).await;
    done(&state, &session, &run_id, "cancel", result).await
}

pub async fn cancel_fork(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path((run_id, fork)): Path<(String, u32)>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    session.check_csrf(&parse_form::<CsrfOnly>(&body)?.csrf)?;
    let req = CancelForkRequest {
        run_id: run_id.clone(),
        fork,
        reason: "cancelled from the console".into(),
    };
    let req = gateway::unary(session.key.as_ref(), req)?;
    let result = state.gateway.client().cancel_fork(req).await;
    done(
        &state,
        &session,
        &run_id,
        &format!("cancel fork {fork}"),
        result,
    )
    .await
}

pub async fn raise(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    Path(run_id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let form: RaiseForm = parse_form(&body)?;
    session.check_csrf(&form.csrf)?;
    let req = RaiseBudgetRequest {
        run_id: run_id.clone(),
        amount_usd: form.amount.trim().to_owned(),
    };
    let req = gateway::unary(session.key.as_ref(), req)?;
    let done = state.gateway.client().raise_budget(req).await;
    tracing::info!(
        run_id,
        action = "raise",
        ok = done.is_ok(),
        "run action from the console"
    );
    let done = done.map(drop);
    // A refusal is about the amount (its value, or the run's state), unless the caller
    // may not change the run at all (an admin reading another tenant's): that goes with
    // the run's actions, shown whatever the run's state.
    let field = match &done {
        Err(s) if s.code() == tonic::Code::PermissionDenied => "",
        _ => "amount",
    };
    answer(&state, &session, &run_id, done, field, form.amount).await
}
