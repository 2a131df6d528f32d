//! `LaunchRunRequest.delivery`: options that make sense together, texts git and a
//! forge take, each refusal naming its field.

use super::fields::{check_branch, field};
use crate::error::GatewayError;
use forkyard_common::repo_location::{self, RepoLocation};
use forkyard_proto::gateway::v1::{
    Delivery, LaunchRunRequest, PublishForkRequest,
    delivery::{PullRequests, Push},
};

const MAX_MESSAGE_BYTES: usize = 64 << 10;
const MAX_NAME_BYTES: usize = 256;

/// The delivery as the run keeps it: `None` when nothing is to leave the mesh.
pub(crate) fn check_delivery(req: &LaunchRunRequest) -> Result<Option<Delivery>, GatewayError> {
    let Some(d) = req.delivery.clone() else {
        return Ok(None);
    };
    let push = Push::try_from(d.push)
        .map_err(|_| field("delivery.push", format!("{} is not a push mode", d.push)))?;
    let prs = PullRequests::try_from(d.pull_requests).map_err(|_| {
        field(
            "delivery.pull_requests",
            format!("{} is not a pull-request mode", d.pull_requests),
        )
    })?;
    let pushes = !matches!(push, Push::Unspecified | Push::None);
    let opens = !matches!(prs, PullRequests::Unspecified | PullRequests::None);
    if opens && !pushes {
        return Err(field(
            "delivery.pull_requests",
            "a pull request needs a pushed branch: set delivery.push",
        ));
    }
    if !pushes {
        return Ok(None);
    }
    if push == Push::Verified && req.verify_command.trim().is_empty() {
        return Err(field(
            "delivery.push",
            "VERIFIED pushes the forks whose verify command passed: set verify_command",
        ));
    }
    if !d.remote.is_empty() {
        check_remote(&d)?;
        if opens {
            return Err(field(
                "delivery.pull_requests",
                "pull requests are opened on the run's own repository: not with delivery.remote",
            ));
        }
    } else if !matches!(
        repo_location::locate(req.repo.trim()),
        Ok(RepoLocation::Remote(_))
    ) {
        return Err(field(
            "delivery.push",
            "only a remote repository's forks are pushed (this run's repo is a local path)",
        ));
    }
    check_texts(&d)?;
    Ok(Some(d))
}

/// `PublishFork`'s options, as a delivery of one fork (the run is checked by the caller).
pub fn publish_delivery(req: &PublishForkRequest) -> Result<Delivery, GatewayError> {
    let d = Delivery {
        push: Push::Winner as i32,
        pull_requests: if req.pull_request {
            PullRequests::Winner
        } else {
            PullRequests::None
        } as i32,
        draft: req.draft,
        commit_message: req.commit_message.clone(),
        author_name: req.author_name.clone(),
        author_email: req.author_email.clone(),
        branch_prefix: req.branch_prefix.clone(),
        remote: String::new(),
    };
    if d.draft && !req.pull_request {
        return Err(field("draft", "drafts are pull requests: set pull_request"));
    }
    check_texts(&d)?;
    Ok(d)
}

/// Another remote to push to: a URL (never a path on the gateway's host), without
/// credentials in it (not echoed).
fn check_remote(d: &Delivery) -> Result<(), GatewayError> {
    if repo_location::carries_credentials(&d.remote) {
        return Err(field(
            "delivery.remote",
            "must not carry credentials (a user name or token in the URL): the mesh holds each host's (FORKYARD_GIT_CREDENTIALS)",
        ));
    }
    match repo_location::locate(d.remote.trim()) {
        Ok(RepoLocation::Remote(_)) => Ok(()),
        Ok(RepoLocation::Local(_)) => Err(field(
            "delivery.remote",
            "must be a remote repository's URL, not a path",
        )),
        Err(why) => Err(field("delivery.remote", why)),
    }
}

/// The texts git and a forge take.
fn check_texts(d: &Delivery) -> Result<(), GatewayError> {
    if !d.branch_prefix.is_empty() {
        check_branch(&d.branch_prefix).map_err(|_| {
            field(
                "delivery.branch_prefix",
                format!("{:?} is not a valid git branch name", d.branch_prefix),
            )
        })?;
    }
    if d.commit_message.len() > MAX_MESSAGE_BYTES || d.commit_message.contains('\0') {
        return Err(field(
            "delivery.commit_message",
            format!("must be at most {MAX_MESSAGE_BYTES} bytes, without NUL"),
        ));
    }
    identity("delivery.author_name", &d.author_name)?;
    identity("delivery.author_email", &d.author_email)
}

/// git refuses (or mangles) names with these, and an email that a forge would show as
/// someone else's must at least be one line.
fn identity(name: &str, value: &str) -> Result<(), GatewayError> {
    let bad = value.len() > MAX_NAME_BYTES
        || value
            .chars()
            .any(|c| c.is_control() || matches!(c, '<' | '>'));
    if bad {
        return Err(field(
            name,
            format!("must be one line of at most {MAX_NAME_BYTES} bytes, without < or >"),
        ));
    }
    Ok(())
}
