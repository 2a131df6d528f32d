//! The run console: server-rendered pages of a mesh's runs and forks.
//!
//! A thin HTTP front end with no privileges of its own: every page is made from the
//! gateway's gRPC API called with the visitor's own API key (kept in an http-only
//! cookie), so tenancy and admin rules stay the gateway's and are enforced in one place.
//! Live run pages are fed by `WatchRun`, batched and sent as Server-Sent Events.
#![forbid(unsafe_code)]

pub mod chart;
pub mod diff;
pub mod error;
pub mod fork_actions;
pub mod fork_forms;
pub mod fork_page;
pub mod fork_tree;
pub mod format;
pub mod gateway;
pub mod layout;
pub mod live;
pub mod login;
pub mod new_run;
pub mod new_run_form;
pub mod new_run_view;
pub mod run_actions;
pub mod run_forms;
pub mod run_page;
pub mod runs_page;
pub mod session;
pub mod transcript;

use axum::{
    Router,
    http::header,
    response::IntoResponse,
    routing::{get, post},
};
pub use error::ConsoleError;
use gateway::Gateway;

/// The console's listen address unless `FORKYARD_CONSOLE_LISTEN` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8088";

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Gateway,
    /// Cookies carry `Secure` (the console is served over https, by itself behind a
    /// proxy); also set per request when a proxy says `X-Forwarded-Proto: https`.
    pub secure_cookies: bool,
}

/// Every route of the console.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/runs") }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(stylesheet))
        .route("/login", get(login::page).post(login::submit))
        .route("/logout", post(login::logout))
        .route("/runs", get(runs_page::page).post(new_run::submit))
        .route("/runs/{run_id}", get(run_page::page))
        .route("/runs/{run_id}/cancel", post(run_actions::cancel))
        .route("/runs/{run_id}/pause", post(run_actions::pause))
        .route("/runs/{run_id}/resume", post(run_actions::resume))
        .route("/runs/{run_id}/budget", post(run_actions::raise))
        .route(
            "/runs/{run_id}/forks/{fork}/cancel",
            post(run_actions::cancel_fork),
        )
        .route(
            "/runs/{run_id}/forks/{fork}/publish",
            post(fork_actions::publish),
        )
        .route(
            "/runs/{run_id}/forks/{fork}/branch",
            post(fork_actions::branch),
        )
        .route("/runs/{run_id}/events", get(live::events))
        .route("/runs/{run_id}/forks/{fork}", get(fork_page::page))
        .fallback(|| async { ConsoleError::NotFound("page".into()) })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            session::layer,
        ))
        .with_state(state)
}

/// The one script, served as a file: the content security policy allows no inline script.
async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../static/console.js"),
    )
}

async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../static/console.css"),
    )
}
