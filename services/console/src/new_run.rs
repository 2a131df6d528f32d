//! The "new run" form's handler: the common case of `LaunchRun` (repository, prompt,
//! forks, driver, model, budget, verify command, labels). A refused launch shows the
//! gateway's message next to the field it names, with nothing started.

use crate::{
    AppState, ConsoleError, gateway,
    new_run_form::{FieldErrors, NewRunForm, field_of},
    runs_page::{self, Filter},
    session::{Session, parse_form},
};
use axum::{
    Extension,
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use forkyard_proto::gateway::v1::LaunchRunResponse;

pub async fn submit(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let form: NewRunForm = parse_form(&body)?;
    session.check_csrf(&form.csrf)?;
    let req = match form.to_request() {
        Ok(req) => req,
        Err(errors) => return refused(&state, &session, &form, errors).await,
    };
    let launched = state
        .gateway
        .client()
        .launch_run(gateway::unary(session.key.as_ref(), req)?)
        .await;
    match launched {
        Ok(resp) => {
            let LaunchRunResponse { run_id, .. } = resp.into_inner();
            tracing::info!(run_id, "run launched from the console");
            Ok(Redirect::to(&format!("/runs/{run_id}")).into_response())
        }
        // The launch's own refusals (validation, the repository, the tenant's policy):
        // next to the field named, the page otherwise unchanged.
        Err(s) if is_refusal(s.code()) => {
            let errors = FieldErrors::from([(field_of(s.message()), s.message().to_owned())]);
            refused(&state, &session, &form, errors).await
        }
        Err(s) => Err(s.into()),
    }
}

fn is_refusal(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        InvalidArgument | FailedPrecondition | PermissionDenied | ResourceExhausted | OutOfRange
    )
}

async fn refused(
    state: &AppState,
    session: &Session,
    form: &NewRunForm,
    errors: FieldErrors,
) -> Result<Response, ConsoleError> {
    let page = runs_page::render(state, session, &Filter::default(), form, &errors).await?;
    Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response())
}
