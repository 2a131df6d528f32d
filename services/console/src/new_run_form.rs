//! The "new run" form's fields as typed (`NewRunForm`), the request they make (as
//! `forkyard fork`'s flags: placement, isolation, search, `--image`, `--egress`,
//! `--push`, `--pr`, `--draft`), and which field a gateway message is about. Below its
//! drawing (`new_run_view`) and its handler (`new_run`).

use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{
        Delivery, LaunchRunRequest, Search,
        delivery::{PullRequests, Push},
    },
};
use std::collections::{BTreeMap, HashMap};

/// The drivers the form offers (`forkyard_proto::Driver`'s names).
pub(crate) const DRIVERS: &[&str] = &["claude-code", "codex", "anthropic", "openai", "command"];

/// The push modes the form offers, as `forkyard fork --push` names them.
pub(crate) const PUSHES: &[(&str, Push)] = &[
    ("winner", Push::Winner),
    ("succeeded", Push::Succeeded),
    ("verified", Push::Verified),
];

/// The pull requests the form offers, as `forkyard fork --pr` names them.
pub(crate) const PULL_REQUESTS: &[(&str, PullRequests)] = &[
    ("winner", PullRequests::Winner),
    ("each", PullRequests::Each),
];

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
    /// The forks' image (`archive:<file>`, or a registry reference); empty: the host's tools.
    pub image: String,
    /// Hosts, `host:port`, `*.domain` or sets (`crates`, `pypi`, …), separated by commas.
    pub egress: String,
    /// Empty: nothing pushed; else a [`PUSHES`] name.
    pub push: String,
    /// Empty: no pull request; else a [`PULL_REQUESTS`] name.
    pub pull_requests: String,
    /// A checkbox: sent (`on`) when ticked.
    pub draft: String,
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
        let delivery = self.delivery(&mut errors);
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
            image: self.image.trim().to_owned(),
            egress: self
                .egress
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect(),
            delivery,
            ..Default::default()
        })
    }

    /// What is delivered: none unless a push, a pull request or drafts is asked for
    /// (the gateway checks that they fit: a pull request needs a push).
    fn delivery(&self, errors: &mut FieldErrors) -> Option<Delivery> {
        let push = choice(errors, "push", &self.push, PUSHES)?;
        let pull_requests = choice(errors, "pull_requests", &self.pull_requests, PULL_REQUESTS)?;
        let draft = !self.draft.is_empty();
        if push.is_none() && pull_requests.is_none() && !draft {
            return None;
        }
        Some(Delivery {
            push: push.unwrap_or(Push::None) as i32,
            pull_requests: pull_requests.unwrap_or(PullRequests::None) as i32,
            draft,
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

/// A select's value: `Some(None)` when empty, `Some(Some(v))` when one of `choices`,
/// `None` (with the form's refusal) when anything else.
fn choice<T: Copy>(
    errors: &mut FieldErrors,
    field: &'static str,
    text: &str,
    choices: &[(&str, T)],
) -> Option<Option<T>> {
    let text = text.trim();
    if text.is_empty() || text == "none" {
        return Some(None);
    }
    match choices.iter().find(|(name, _)| *name == text) {
        Some((_, v)) => Some(Some(*v)),
        None => {
            errors.insert(
                field,
                format!("{field}: {text:?} is not one of the choices"),
            );
            None
        }
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
        "image" => "image",
        name if name.starts_with("egress") => "egress",
        "delivery.pull_requests" => "pull_requests",
        name if name.starts_with("delivery") => "push",
        _ => "",
    }
}

#[cfg(test)]
#[path = "new_run_form_tests.rs"]
mod tests;
