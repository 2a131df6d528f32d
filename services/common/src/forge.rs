//! Pull requests (GitHub) and merge requests (GitLab) opened by the mesh on a forge's REST
//! API, with a token from `crate::git_credentials` (`GitCredentials::forge_for`).
//!
//! Opening is idempotent, since delivery is a retried step of a run: when the forge says
//! one is already open for the branch (GitHub's 422, GitLab's 409), the open one is looked
//! up and returned with `existed`, so a retry after a lost answer finds the pull request
//! its first attempt opened instead of failing or opening a second.
//!
//! Every call has a 10 s connect and a 30 s total timeout and reads at most 1 MiB of
//! answer. A [`ForgeError`] says whether the call is worth retrying (5xx, 429, no answer)
//! and names the forge, the repository, the status and the API's own message: never the
//! token, which goes in one header marked sensitive.

pub(crate) mod github;
mod gitlab;
pub(crate) mod http;

use crate::secret::Secret;
use serde::Deserialize;

/// A forge's REST API flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Forge {
    /// github.com or GitHub Enterprise Server (`https://host/api/v3`).
    GitHub,
    /// gitlab.com or a GitLab instance (`https://host/api/v4`).
    GitLab,
}

impl std::fmt::Display for Forge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Forge::GitHub => "github",
            Forge::GitLab => "gitlab",
        })
    }
}

impl Forge {
    /// The forge a host is known to be, without being told: github.com and gitlab.com.
    pub fn of_host(host: &str) -> Option<(Forge, &'static str)> {
        match host {
            "github.com" => Some((Forge::GitHub, "https://api.github.com")),
            "gitlab.com" => Some((Forge::GitLab, "https://gitlab.com/api/v4")),
            _ => None,
        }
    }

    /// Where a self-hosted instance on `authority` (`host` or `host:port`) serves its API.
    pub fn self_hosted_api(self, authority: &str) -> String {
        match self {
            Forge::GitHub => format!("https://{authority}/api/v3"),
            Forge::GitLab => format!("https://{authority}/api/v4"),
        }
    }
}

/// What calling a forge's API takes: its flavour, its base URL and the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgeAccess {
    pub forge: Forge,
    /// The API's base: `https://api.github.com`, `https://gitlab.com/api/v4`.
    pub api: url::Url,
    pub token: Secret,
}

/// A pull (merge) request to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// The branch with the change, on the same repository.
    pub head: String,
    /// The branch it is to be merged into.
    pub base: String,
    pub title: String,
    /// Markdown.
    pub body: String,
    pub draft: bool,
}

/// The pull (merge) request open for the branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// Its page (`html_url`, `web_url`).
    pub url: String,
    /// GitHub's number, GitLab's `iid`.
    pub number: u64,
    /// It was open already (opened by an earlier attempt, or by someone else).
    pub existed: bool,
}

/// Why a forge call failed. Messages name the forge, what was asked and, for an
/// answer, its status and the API's own message; never a token.
#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    /// The API answered with an error status.
    #[error("{forge} {what}: http {status}: {message}")]
    Status {
        forge: Forge,
        what: String,
        status: u16,
        message: String,
    },
    /// No answer within the timeout.
    #[error("{forge} {what}: no answer within {secs} s", secs = http::TOTAL_TIMEOUT.as_secs())]
    Timeout { forge: Forge, what: String },
    /// The API could not be reached, or the connection broke.
    #[error("{forge} {what}: {reason}")]
    Unreachable {
        forge: Forge,
        what: String,
        reason: String,
    },
    /// The API said one is open for the branch, then listed none (it may not list it yet).
    #[error("{forge} {what}: the api says one is open for {head}, and lists none")]
    NotListed {
        forge: Forge,
        what: String,
        head: String,
    },
    /// A successful answer that is not what the API documents (or over 1 MiB).
    #[error("{forge} {what}: unexpected answer: {reason}")]
    Answer {
        forge: Forge,
        what: String,
        reason: String,
    },
    /// Nothing was sent: the request or the credential cannot be used.
    #[error("{0}")]
    Setup(String),
}

impl ForgeError {
    /// Whether trying again later may succeed: a server error, 429, 408, no answer, or a
    /// pull request the API has not listed yet. 401, 403, 404 and other 4xx are final.
    pub fn is_retryable(&self) -> bool {
        match self {
            ForgeError::Status { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            ForgeError::Timeout { .. }
            | ForgeError::Unreachable { .. }
            | ForgeError::NotListed { .. } => true,
            ForgeError::Answer { .. } | ForgeError::Setup(_) => false,
        }
    }

    /// The same error, saying where it came from (`credential for github.com`).
    pub fn context(mut self, context: &str) -> Self {
        match &mut self {
            ForgeError::Status { what, .. }
            | ForgeError::Timeout { what, .. }
            | ForgeError::Unreachable { what, .. }
            | ForgeError::NotListed { what, .. }
            | ForgeError::Answer { what, .. } => *what = format!("{what} ({context})"),
            ForgeError::Setup(why) => *why = format!("{context}: {why}"),
        }
        self
    }

    /// The HTTP status the API answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ForgeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Open a pull request (GitHub) or merge request (GitLab) on `repo_path` (a located
/// remote's `path`: `owner/name`; GitLab: `group/subgroup/name`), or find the one already
/// open for `pr.head` into `pr.base` (`existed`).
pub async fn open_pull_request(
    access: &ForgeAccess,
    repo_path: &str,
    pr: &PullRequest,
) -> Result<Opened, ForgeError> {
    let repo_path = repo_path.trim_matches('/');
    let repo_path = repo_path.strip_suffix(".git").unwrap_or(repo_path);
    match access.forge {
        Forge::GitHub => github::open(access, repo_path, pr).await,
        Forge::GitLab => gitlab::open(access, repo_path, pr).await,
    }
}

#[cfg(test)]
#[path = "forge_tests.rs"]
mod tests;
