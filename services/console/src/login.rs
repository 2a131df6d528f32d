//! Signing in: the API key asked for once, checked with the gateway, kept in an
//! http-only cookie; signing out clears it.

use crate::{
    AppState, ConsoleError,
    gateway::{self, ApiKey},
    layout::{csrf_field, page as layout},
    session::{KEY_COOKIE, Session, parse_form},
};
use axum::{
    Extension,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Redirect, Response},
};
use forkyard_proto::gateway::v1::ListRunsRequest;
use maud::{Markup, html};

#[derive(serde::Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    key: String,
    #[serde(default)]
    csrf: String,
}

#[derive(serde::Deserialize)]
pub struct CsrfOnly {
    #[serde(default)]
    pub csrf: String,
}

pub async fn page(Extension(session): Extension<Session>) -> Markup {
    form(&session, None)
}

fn form(session: &Session, error: Option<&str>) -> Markup {
    let body = html! {
        h1 { "Sign in" }
        p { "Paste an API key (" code { "forkyard keys create" } "). It is kept in an http-only cookie of this browser." }
        form.login method="post" action="/login" {
            (csrf_field(session))
            label for="key" { "API key" }
            input #key type="password" name="key" autocomplete="off" required
                aria-describedby=[error.map(|_| "key-error")];
            @if let Some(e) = error {
                p #key-error .field-error role="alert" { (e) }
            }
            button type="submit" { "Sign in" }
        }
    };
    layout("Sign in", Some(session), body)
}

/// Checks the key with the gateway (a one-run listing) before keeping it, so a typo is
/// said here rather than on the next page.
pub async fn submit(
    State(state): State<AppState>,
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let f: LoginForm = parse_form(&body)?;
    session.check_csrf(&f.csrf)?;
    let Some(key) = ApiKey::parse(&f.key) else {
        let page = form(&session, Some("that is not an api key"));
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };
    let probe = ListRunsRequest {
        page_size: 1,
        ..Default::default()
    };
    match state
        .gateway
        .client()
        .list_runs(gateway::unary(Some(&key), probe)?)
        .await
    {
        Ok(_) => {}
        Err(s) if s.code() == tonic::Code::Unauthenticated => {
            let page = form(&session, Some(s.message()));
            return Ok((StatusCode::UNAUTHORIZED, page).into_response());
        }
        Err(s) => return Err(s.into()),
    }
    tracing::info!("a visitor signed in");
    let cookie = session.cookie(KEY_COOKIE, Some(key.expose()));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/runs")).into_response())
}

pub async fn logout(
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let f: CsrfOnly = parse_form(&body)?;
    session.check_csrf(&f.csrf)?;
    let cookie = session.cookie(KEY_COOKIE, None);
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response())
}
