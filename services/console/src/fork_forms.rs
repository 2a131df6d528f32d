//! A fork's action forms as its page draws them (the actions themselves are
//! `fork_actions`): where it was delivered, publish, branch.

use crate::{format, layout::csrf_field, new_run_form::FieldErrors, session::Session};
use forkyard_proto::{
    common::v1::{ForkResult, ForkStatus},
    gateway::v1::Run,
};
use maud::{Markup, html};

/// Where the fork was delivered, and the forms its state allows.
pub fn forms(run: &Run, f: &ForkResult, session: &Session, errors: &FieldErrors) -> Markup {
    let base = format!("/runs/{}/forks/{}", run.run_id, f.fork);
    let publishable = f.status == ForkStatus::Succeeded as i32 && !format::run_live(run.state);
    let branch_window = run.spec.as_ref().is_some_and(|s| s.branch_window_secs > 0);
    let branchable = branch_window && format::run_live(run.state) && format::fork_done(f.status);
    html! {
        @if let Some(d) = &f.delivered {
            section #delivered { h2 { "Delivered" }
                p { "Branch " code { (d.branch) } @if !d.commit.is_empty() { " at " code { (d.commit) } }
                    @if !d.remote.is_empty() { " on " code { (d.remote) } } }
                @if is_web_url(&d.pull_request_url) {
                    p { "Pull request: " a href=(d.pull_request_url) rel="noreferrer" { (d.pull_request_url) } } }
                @if !d.error.is_empty() { p.error { (d.error) } }
            }
        } @else if publishable {
            form #publish .actions method="post" action=(format!("{base}/publish")) {
                (csrf_field(session))
                label { input type="checkbox" name="pull_request" value="on"; " open a pull request" }
                label { input type="checkbox" name="draft" value="on"; " as a draft" }
                button type="submit" { "Push this fork" }
                (error("publish", errors))
            }
        }
        @if branchable {
            form #branch .actions method="post" action=(format!("{base}/branch")) novalidate {
                (csrf_field(session))
                label for="branch-count" { "Branches" }
                input #branch-count type="number" name="count" min="1" value="1" size="3"
                    aria-describedby=[errors.contains_key("count").then_some("count-error")];
                label for="branch-prompt" { "Next prompt" }
                input #branch-prompt type="text" name="prompt" placeholder="empty: the run's prompt again"
                    aria-describedby=[errors.contains_key("prompt").then_some("prompt-error")];
                button type="submit" { "Branch" }
                (error("count", errors)) (error("prompt", errors)) (error("branch", errors))
            }
        }
    }
}

/// Only a web address becomes a link (never `javascript:` or the like).
fn is_web_url(url: &str) -> bool {
    url.starts_with("https://") || url.starts_with("http://")
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
    fn forms_follow_the_forks_and_runs_state() {
        use forkyard_proto::gateway::v1::{RunSpec, RunState};
        let s = Session {
            key: None,
            csrf: "t".into(),
            secure: false,
        };
        let mut run = Run {
            run_id: "r".into(),
            state: RunState::Completed as i32,
            ..Default::default()
        };
        let ok = ForkResult {
            fork: 1,
            status: ForkStatus::Succeeded as i32,
            ..Default::default()
        };
        let html = forms(&run, &ok, &s, &FieldErrors::new()).into_string();
        assert!(
            html.contains("id=\"publish\"") && !html.contains("id=\"branch\""),
            "{html}"
        );
        run.state = RunState::Running as i32;
        run.spec = Some(RunSpec {
            branch_window_secs: 60,
            ..Default::default()
        });
        let html = forms(&run, &ok, &s, &FieldErrors::new()).into_string();
        assert!(
            !html.contains("id=\"publish\"") && html.contains("id=\"branch\""),
            "{html}"
        );
    }
}
