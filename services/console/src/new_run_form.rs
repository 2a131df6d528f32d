//! The "new run" form itself: its fields as typed (`NewRunForm`), the request they make,
//! which field a gateway message is about, and the form drawn with each field's error.
//! Below both the runs page (which shows it) and its handler (`new_run`).

use crate::{layout::csrf_field, session::Session};
use forkyard_proto::{common::v1::AgentSpec, gateway::v1::LaunchRunRequest};
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
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(LaunchRunRequest {
            request_id: self.request_id.clone(),
            repo: self.repo.trim().to_owned(),
            prompt: self.prompt.clone(),
            forks,
            max_concurrent: forks,
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
}

/// The form field a gateway message is about: its messages start with the request's
/// field name (`budget_usd: …`, `agent.model: …`).
pub fn field_of(message: &str) -> &'static str {
    let name = message.split(':').next().unwrap_or_default().trim();
    match name {
        "repo" | "base_ref" => "repo",
        "prompt" => "prompt",
        "forks" | "max_concurrent" => "forks",
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
                button type="submit" { "Start run" }
            }
        }
    }
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
            ..NewRunForm::blank()
        };
        let errors = f.to_request().unwrap_err();
        assert!(errors["forks"].starts_with("forks:"));
        assert!(errors["labels"].starts_with("labels:"));
    }
}
