//! The "new run" form drawn: `NewRunForm`'s values, each field's error next to it, the
//! common case shown and two sections (placement, isolation and search; image, egress and
//! delivery) opened when one of their fields is filled in or refused.

use crate::{
    layout::csrf_field,
    new_run_form::{DRIVERS, FieldErrors, NewRunForm, PULL_REQUESTS, PUSHES},
    session::Session,
};
use maud::{Markup, html};

/// The form, with `form`'s values and `errors` next to their fields.
pub fn form(session: &Session, form: &NewRunForm, errors: &FieldErrors) -> Markup {
    html! {
        section #new-run aria-labelledby="new-run-title" {
            h2 #new-run-title { "New run" }
            form method="post" action="/runs" novalidate {
                (csrf_field(session))
                input type="hidden" name="request_id" value=(form.request_id);
                @if let Some(e) = errors.get("") { p #form-error .field-error role="alert" { (e) } }
                (input("repo", "Repository", "text", &form.repo, errors))
                div.field {
                    label for="prompt" { "Prompt" }
                    textarea #prompt name="prompt" rows="4" aria-describedby=[described("prompt", errors)] { (form.prompt) }
                    (error("prompt", errors))
                }
                (input("forks", "Forks", "number", &form.forks, errors))
                div.field {
                    label for="driver" { "Driver" }
                    select #driver name="driver" aria-describedby=[described("driver", errors)] {
                        @for d in DRIVERS { option value=(d) selected[form.driver == *d] { (d) } }
                    }
                    (error("driver", errors))
                }
                (input("command", "Command (command driver)", "text", &form.command, errors))
                (input("model", "Model", "text", &form.model, errors))
                (input("budget", "Budget (USD)", "text", &form.budget, errors))
                (input("verify", "Verify command", "text", &form.verify, errors))
                (input("labels", "Labels (key=value, …)", "text", &form.labels, errors))
                details #more open[more_open(form, errors)] {
                    summary { "Placement, isolation and search" }
                    (input("max_concurrent", "At most at once (empty: every fork)", "number", &form.max_concurrent, errors))
                    (input("backend", "Backend (local, e2b, or shares such as local:40,e2b)", "text", &form.backend, errors))
                    (select("isolation", "Isolation", &form.isolation, forkyard_proto::ISOLATIONS.iter().copied(), "the operator's default", errors))
                    (input("branch_window", "Branch window (seconds open for branches)", "number", &form.branch_window, errors))
                    fieldset #search {
                        legend { "Search: the best forks of each round branched into the next" }
                        (input("rounds", "Rounds (2 or more; empty: no search)", "number", &form.rounds, errors))
                        (input("keep", "Kept each round", "number", &form.keep, errors))
                        (input("branches", "Branches of each kept fork", "number", &form.branches, errors))
                        (input("follow_up", "Follow-up ({prompt} {fork} {round} {verify_exit_code} {verify_output})", "text", &form.follow_up, errors))
                    }
                }
                (sandbox_and_delivery(form, errors))
                button type="submit" { "Start run" }
            }
        }
    }
}

/// The image, egress and delivery section.
fn sandbox_and_delivery(form: &NewRunForm, errors: &FieldErrors) -> Markup {
    let open = opened(
        &[
            ("image", &form.image),
            ("egress", &form.egress),
            ("push", &form.push),
            ("pull_requests", &form.pull_requests),
            ("draft", &form.draft),
        ],
        errors,
    );
    html! {
        details #deliver open[open] {
            summary { "Image, egress and delivery" }
            (input("image", "Image (archive:<file>, or a registry reference; empty: the host's tools)", "text", &form.image, errors))
            (input("egress", "Egress (hosts, host:port, *.domain or sets such as crates, pypi, npm, github; commas between)", "text", &form.egress, errors))
            (select("push", "Push as branches", &form.push, PUSHES.iter().map(|c| c.0), "nothing (the patches stay in the run)", errors))
            (select("pull_requests", "Pull requests", &form.pull_requests, PULL_REQUESTS.iter().map(|c| c.0), "none", errors))
            div.field {
                label {
                    input #draft type="checkbox" name="draft" checked[!form.draft.is_empty()];
                    " Pull requests as drafts"
                }
            }
        }
    }
}

/// A select of `choices` with an empty first option (`none`, what leaving it means).
fn select<'a>(
    name: &str,
    text: &str,
    value: &str,
    choices: impl Iterator<Item = &'a str>,
    none: &str,
    errors: &FieldErrors,
) -> Markup {
    html! {
        div.field {
            label for=(name) { (text) }
            select id=(name) name=(name) aria-describedby=[described(name, errors)] {
                option value="" selected[value.is_empty()] { (none) }
                @for c in choices { option value=(c) selected[value == c] { (c) } }
            }
            (error(name, errors))
        }
    }
}

/// The placement and search section is shown when one of its fields is filled in or refused.
fn more_open(form: &NewRunForm, errors: &FieldErrors) -> bool {
    opened(
        &[
            ("max_concurrent", &form.max_concurrent),
            ("backend", &form.backend),
            ("isolation", &form.isolation),
            ("branch_window", &form.branch_window),
            ("rounds", &form.rounds),
            ("keep", &form.keep),
            ("branches", &form.branches),
            ("follow_up", &form.follow_up),
        ],
        errors,
    )
}

/// Whether a section of these fields is shown: one is filled in or refused.
fn opened(fields: &[(&str, &String)], errors: &FieldErrors) -> bool {
    fields
        .iter()
        .any(|(name, value)| !value.trim().is_empty() || errors.contains_key(name))
}

fn input(name: &str, text: &str, kind: &str, value: &str, errors: &FieldErrors) -> Markup {
    html! {
        div.field {
            label for=(name) { (text) }
            input id=(name) type=(kind) name=(name) value=(value)
                aria-invalid=[errors.contains_key(name).then_some("true")]
                aria-describedby=[described(name, errors)];
            (error(name, errors))
        }
    }
}

fn described(name: &str, errors: &FieldErrors) -> Option<String> {
    errors.contains_key(name).then(|| format!("{name}-error"))
}

fn error(name: &str, errors: &FieldErrors) -> Markup {
    html! {
        @if let Some(e) = errors.get(name) {
            p.field-error id=(format!("{name}-error")) role="alert" { (e) }
        }
    }
}
