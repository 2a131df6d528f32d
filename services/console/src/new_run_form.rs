//! The "new run" form itself: its fields as typed (`NewRunForm`), the request they make,
//! which field a gateway message is about, and the form drawn with each field's error.
//! Below both the runs page (which shows it) and its handler (`new_run`).

use crate::{layout::csrf_field, session::Session};
use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{LaunchRunRequest, Search},
};
use maud::{Markup, html};
use std::collections::{BTreeMap, HashMap};

/// The drivers the form offers (`forkyard_proto::Driver`'s names).
const DRIVERS: &[&str] = &["claude-code", "codex", "anthropic", "openai", "command"];

/// Field name → message; `""` for a message that names no field of the form.
pub type FieldErrors = BTreeMap<&'static str, String>;

#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct NewRunForm {
    pub csrf: String,
    /// Made when the form is drawn: a form sent twice starts one run.
    pub request_id: String,
    pub repo: String,
    pub prompt: String,
    pub forks: String,
    pub driver: String,
    pub command: String,
    pub model: String,
    pub budget: String,
    pub verify: String,
    /// `key=value` pairs separated by commas.
    pub labels: String,
    /// Forks in flight at once; empty: all of them.
    pub max_concurrent: String,
    /// `local`, `e2b` or a list with shares (`local:40,e2b`); empty: the operator's.
    pub backend: String,
    /// `bubblewrap` or `gvisor`; empty: the operator's.
    pub isolation: String,
    /// Seconds the run stays open for branches after its last fork; empty: none.
    pub branch_window: String,
    /// A search (rounds of 2 or more); empty: one round.
    pub rounds: String,
    pub keep: String,
    pub branches: String,
    pub follow_up: String,
}

/// A number field: empty is `None`; anything else not a number is the form's refusal.
fn number(errors: &mut FieldErrors, field: &'static str, text: &str) -> Option<u32> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    text.parse().map_or_else(
        |_| {
            errors.insert(field, format!("{field}: {text:?} is not a number"));
            None
        },
        Some,
    )
}

impl NewRunForm {
    pub fn blank() -> Self {
        Self {
            request_id: format!("console-{}", uuid::Uuid::new_v4().simple()),
            forks: "3".into(),
            driver: "claude-code".into(),
            budget: "5".into(),
            ..Self::default()
        }
    }

    /// The request, or the form's own refusals (what the gateway never sees).
    pub fn to_request(&self) -> Result<LaunchRunRequest, FieldErrors> {
        let mut errors = FieldErrors::new();
        let forks = self.forks.trim().parse::<u32>().unwrap_or_else(|_| {
            errors.insert("forks", format!("forks: {:?} is not a number", self.forks));
            0
        });
        let mut labels = HashMap::new();
        for pair in self.labels.split(',').filter(|p| !p.trim().is_empty()) {
            match pair.split_once('=') {
                Some((k, v)) => labels.insert(k.trim().to_owned(), v.trim().to_owned()),
                None => {
                    errors.insert("labels", format!("labels: {pair:?} is not key=value"));
                    None
                }
            };
        }
        let max_concurrent = number(&mut errors, "max_concurrent", &self.max_concurrent);
        let branch_window_secs = number(&mut errors, "branch_window", &self.branch_window);
        let search = self.search(&mut errors);
        let (backend, backends) =
            forkyard_proto::backends::parse(&self.backend).unwrap_or_else(|e| {
                errors.insert("backend", format!("backend: {e}"));
                Default::default()
            });
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(LaunchRunRequest {
            request_id: self.request_id.clone(),
            repo: self.repo.trim().to_owned(),
            prompt: self.prompt.clone(),
            forks,
            max_concurrent: max_concurrent.unwrap_or(forks),
            backend,
            backends,
            isolation: self.isolation.trim().to_owned(),
            branch_window_secs: branch_window_secs.unwrap_or(0),
            search,
            budget_usd: self.budget.trim().to_owned(),
            agent: Some(AgentSpec {
                driver: self.driver.trim().to_owned(),
                command: self.command.clone(),
                model: self.model.trim().to_owned(),
                ..Default::default()
            }),
            labels,
            verify_command: self.verify.clone(),
            ..Default::default()
        })
    }

    /// The search the form asks for: none unless rounds is filled in; the gateway
    /// checks the figures (`search.rounds: …`).
    fn search(&self, errors: &mut FieldErrors) -> Option<Search> {
        let rounds = number(errors, "rounds", &self.rounds)?;
        Some(Search {
            rounds,
            keep: number(errors, "keep", &self.keep).unwrap_or(1),
            branches: number(errors, "branches", &self.branches).unwrap_or(1),
            follow_up: self.follow_up.clone(),
        })
    }
}

/// The form field a gateway message is about: its messages start with the request's
/// field name (`budget_usd: …`, `agent.model: …`).
pub fn field_of(message: &str) -> &'static str {
    let name = message.split(':').next().unwrap_or_default().trim();
    match name {
        "repo" | "base_ref" => "repo",
        "prompt" => "prompt",
        "forks" => "forks",
        "max_concurrent" => "max_concurrent",
        "backend" => "backend",
        name if name.starts_with("backends") => "backend",
        "isolation" => "isolation",
        "branch_window_secs" => "branch_window",
        "search.rounds" | "search" => "rounds",
        "search.keep" => "keep",
        "search.branches" => "branches",
        "search.follow_up" => "follow_up",
        "budget_usd" | "fork_budget_usd" => "budget",
        "agent" | "agent.driver" => "driver",
        "agent.command" => "command",
        "agent.model" | "agent.allowed_models" => "model",
        "verify_command" | "verify_timeout_secs" => "verify",
        "labels" => "labels",
        _ => "",
    }
}

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
                    div.field {
                        label for="isolation" { "Isolation" }
                        select #isolation name="isolation" aria-describedby=[described("isolation", errors)] {
                            option value="" selected[form.isolation.is_empty()] { "the operator's default" }
                            @for i in forkyard_proto::ISOLATIONS { option value=(i) selected[form.isolation == *i] { (i) } }
                        }
                        (error("isolation", errors))
                    }
                    (input("branch_window", "Branch window (seconds open for branches)", "number", &form.branch_window, errors))
                    fieldset #search {
                        legend { "Search: the best forks of each round branched into the next" }
                        (input("rounds", "Rounds (2 or more; empty: no search)", "number", &form.rounds, errors))
                        (input("keep", "Kept each round", "number", &form.keep, errors))
                        (input("branches", "Branches of each kept fork", "number", &form.branches, errors))
                        (input("follow_up", "Follow-up ({prompt} {fork} {round} {verify_exit_code} {verify_output})", "text", &form.follow_up, errors))
                    }
                }
                button type="submit" { "Start run" }
            }
        }
    }
}

/// The optional fields are shown when one is filled in or refused.
fn more_open(form: &NewRunForm, errors: &FieldErrors) -> bool {
    [
        ("max_concurrent", &form.max_concurrent),
        ("backend", &form.backend),
        ("isolation", &form.isolation),
        ("branch_window", &form.branch_window),
        ("rounds", &form.rounds),
        ("keep", &form.keep),
        ("branches", &form.branches),
        ("follow_up", &form.follow_up),
    ]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_messages_land_on_their_field() {
        assert_eq!(field_of("budget_usd: must be a positive amount"), "budget");
        assert_eq!(field_of("agent.model: \"x\" is not a model name"), "model");
        assert_eq!(field_of("forks: must be at least 1"), "forks");
        assert_eq!(field_of("repo: not a git repository"), "repo");
        assert_eq!(field_of("the tenant's limit is spent"), "");
        assert_eq!(field_of("search.keep: at most forks (3)"), "keep");
        assert_eq!(
            field_of("backends[1].name: \"modal\" is not offered"),
            "backend"
        );
        assert_eq!(
            field_of("max_concurrent: must be at least 1"),
            "max_concurrent"
        );
        assert_eq!(
            field_of("branch_window_secs: at most 86400"),
            "branch_window"
        );
    }

    #[test]
    fn placement_and_search_reach_the_launch() {
        let f = NewRunForm {
            forks: "4".into(),
            max_concurrent: "2".into(),
            backend: "local:1, e2b".into(),
            isolation: "gvisor".into(),
            branch_window: "60".into(),
            rounds: "3".into(),
            keep: "2".into(),
            follow_up: "round {round}: {verify_output}".into(),
            ..NewRunForm::blank()
        };
        let req = f.to_request().unwrap();
        assert_eq!((req.forks, req.max_concurrent), (4, 2));
        assert_eq!(req.backend, "");
        let shares: Vec<_> = req
            .backends
            .iter()
            .map(|b| (b.name.as_str(), b.max_concurrent))
            .collect();
        assert_eq!(shares, [("local", 1), ("e2b", 0)]);
        assert_eq!(
            (req.isolation.as_str(), req.branch_window_secs),
            ("gvisor", 60)
        );
        assert_eq!(
            req.search,
            Some(Search {
                rounds: 3,
                keep: 2,
                branches: 1,
                follow_up: "round {round}: {verify_output}".into(),
            })
        );
        // Left empty: every fork at once, no search, the operator's backend.
        let plain = NewRunForm::blank().to_request().unwrap();
        assert_eq!(plain.max_concurrent, plain.forks);
        assert_eq!((plain.search, plain.backend.as_str()), (None, ""));
    }

    #[test]
    fn the_form_becomes_a_launch() {
        let f = NewRunForm {
            repo: " /tmp/r ".into(),
            forks: "3".into(),
            driver: "command".into(),
            labels: "team=a, kind = demo".into(),
            ..NewRunForm::blank()
        };
        let req = f.to_request().unwrap();
        assert_eq!(
            (req.repo.as_str(), req.forks, req.max_concurrent),
            ("/tmp/r", 3, 3)
        );
        assert_eq!(req.labels["kind"], "demo");
        assert!(req.request_id.starts_with("console-"));
    }

    #[test]
    fn the_forms_own_refusals_name_the_field() {
        let f = NewRunForm {
            forks: "three".into(),
            labels: "oops".into(),
            backend: "modal".into(),
            rounds: "two".into(),
            ..NewRunForm::blank()
        };
        let errors = f.to_request().unwrap_err();
        assert!(errors["forks"].starts_with("forks:"));
        assert!(errors["labels"].starts_with("labels:"));
        assert!(errors["backend"].starts_with("backend: \"modal\""));
        assert!(errors["rounds"].starts_with("rounds:"));
    }
}
