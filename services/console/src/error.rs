//! What can go wrong in a request, and the page each answer shows.

use crate::layout;
use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::html;
use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No key, or one the gateway refuses.
    #[error("sign in with an api key: {0}")]
    Unauthenticated(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("not allowed: {0}")]
    PermissionDenied(String),
    /// A POST whose token is not the session's: made elsewhere, or from a stale page.
    #[error("the form's csrf token is missing or does not match: reload the page and try again")]
    Csrf,
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("cannot reach the gateway: {0}")]
    Unavailable(String),
    #[error("the gateway said {code:?}: {message}")]
    Gateway { code: Code, message: String },
}

impl From<tonic::Status> for ConsoleError {
    fn from(s: tonic::Status) -> Self {
        let message = s.message().to_owned();
        match s.code() {
            Code::Unauthenticated => Self::Unauthenticated(message),
            // Another tenant's run is NOT_FOUND at the gateway, as an unknown one is.
            Code::NotFound => Self::NotFound(message),
            Code::PermissionDenied => Self::PermissionDenied(message),
            Code::InvalidArgument => Self::BadRequest(message),
            Code::Unavailable => Self::Unavailable(message),
            code => Self::Gateway { code, message },
        }
    }
}

impl ConsoleError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::PermissionDenied(_) | Self::Csrf => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Gateway { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::Unauthenticated(_) => "Sign in",
            Self::NotFound(_) => "Not found",
            Self::PermissionDenied(_) => "Not allowed",
            Self::Csrf => "Form expired",
            Self::BadRequest(_) => "Bad request",
            Self::Unavailable(_) | Self::Gateway { .. } => "Gateway error",
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        let body = html! {
            h1 { (self.title()) }
            p.error role="alert" { (self.to_string()) }
            @if matches!(self, Self::Unauthenticated(_)) {
                p { a href="/login" { "Sign in with an API key" } }
            } @else {
                p { a href="/runs" { "Back to the runs" } }
            }
        };
        (status, layout::page(self.title(), None, body)).into_response()
    }
}
