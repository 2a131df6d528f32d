//! A run's action forms as its page draws them (the actions themselves are
//! `run_actions`): pause or resume and cancel, redrawn with the live summary; the
//! budget's raise, outside it; and what a refused action brings back to them.

use crate::{layout::csrf_field, new_run_form::FieldErrors, session::Session};
use forkyard_proto::gateway::v1::{Run, RunState};
use maud::{Markup, html};

/// An action the gateway refused: its message, next to the field it names (`amount`)
/// or above the run's actions (`""`), and what was typed.
#[derive(Debug, Default)]
pub struct Refused {
    pub errors: FieldErrors,
    pub amount: String,
}

/// Pause or resume (by the run's state), and cancel: redrawn with the summary.
pub fn buttons(run: &Run, session: &Session) -> Markup {
    let id = &run.run_id;
    let paused = run.state == RunState::Paused as i32;
    html! {
        div.actions #run-actions {
            @if paused {
                form #resume-run method="post" action=(format!("/runs/{id}/resume")) {
                    (csrf_field(session)) button type="submit" { "Resume" }
                }
            } @else {
                form #pause-run method="post" action=(format!("/runs/{id}/pause")) {
                    (csrf_field(session)) button type="submit" { "Pause" }
                }
            }
            form #cancel-run method="post" action=(format!("/runs/{id}/cancel")) {
                (csrf_field(session)) button.danger type="submit" { "Cancel run" }
            }
        }
    }
}

/// The raise-budget form. Not part of the live summary, so a live update never wipes
/// what is being typed or the message of a refused amount.
pub fn raise_form(run: &Run, session: &Session, refused: &Refused) -> Markup {
    let error = refused.errors.get("amount");
    html! {
        form #raise-budget .actions method="post" action=(format!("/runs/{}/budget", run.run_id)) novalidate {
            (csrf_field(session))
            label for="amount" { "Raise the budget by (USD)" }
            input #amount type="text" name="amount" inputmode="decimal" size="8" value=(refused.amount)
                aria-invalid=[error.map(|_| "true")] aria-describedby=[error.map(|_| "amount-error")];
            button type="submit" { "Raise budget" }
            @if let Some(e) = error { p #amount-error .field-error role="alert" { (e) } }
        }
    }
}
