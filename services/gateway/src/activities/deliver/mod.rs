//! Results out (`LaunchRunRequest.delivery`): once a run's forks are done, the chosen
//! forks' changes pushed as branches of the run's repository and pull (merge) requests
//! opened for them, by one activity of the gateway's own queue.
//!
//! From the mesh's side: the tenant's git credentials (`FORKYARD_GIT_CREDENTIALS`) are
//! used by the gateway's host git and forge client, never by a sandbox, and appear in
//! no input, result or log. The patches are read by the activity itself (the run's
//! query for an inline fork, the child's result otherwise), so no patch goes into the
//! run's history as the activity's input.
//!
//! Exactly once, whenever it is killed: the commits are deterministic and each branch is
//! leased to be new (see [`push`]), and a pull request that exists is found, not opened
//! again (`forkyard_common::forge`). A fork's failure is its own (`Delivered.error`);
//! the activity fails as a whole only for what a retry may mend (the run's patches not
//! readable), and after its retries the run reports that on every fork it chose.

pub mod push;
pub mod text;

use super::heartbeat::heartbeating;
use crate::repo_policy::RepoPolicy;
use forkyard_common::{
    forge::{self, ForgeAccess, PullRequest},
    git_pin::GitPin,
    repo_location::{self, RepoLocation},
};
use forkyard_proto::common::v1::{Delivered, ForkResult};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

/// How the activity reads a fork's whole result (its patch): the run keeps an inline
/// fork's, a child its own. Given by the gateway (`workflows::fork_results`), which
/// knows those workflows; the error says why it could not be read.
pub type ForkResults = Arc<
    dyn Fn(String, u32) -> futures::future::BoxFuture<'static, Result<ForkResult, String>>
        + Send
        + Sync,
>;

/// The activity's host: how to read the forks' patches, and the repository policy
/// (allowed hosts, the tenants' credentials).
pub struct DeliverLocal {
    results: ForkResults,
    repos: RepoPolicy,
}

impl DeliverLocal {
    pub fn new(results: ForkResults, repos: RepoPolicy) -> Self {
        Self { results, repos }
    }
}

/// What to deliver: the run's repository and tenant, the forks chosen, how to write
/// their commits and pull requests.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeliverInput {
    pub tenant: String,
    pub repo: String,
    /// Where the branches go; empty: `repo` itself (`Delivery.remote`).
    pub remote: String,
    /// The branch pull requests go against; empty: the remote's default branch.
    pub base_branch: String,
    pub facts: text::RunFacts,
    pub forks: Vec<DeliverFork>,
    pub draft: bool,
    /// The commit message; empty: [`text::commit_message`].
    pub commit_message: String,
    pub author_name: String,
    pub author_email: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeliverFork {
    pub fork: u32,
    pub branch: String,
    pub pull_request: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeliverDone {
    pub forks: Vec<(u32, Delivered)>,
}

#[activities]
impl DeliverLocal {
    /// Push the chosen forks' branches (one push) and open their pull requests.
    #[activity(name = "DeliverLocal.deliver")]
    pub async fn deliver(
        self: Arc<Self>,
        ctx: ActivityContext,
        input: DeliverInput,
    ) -> Result<DeliverDone, ActivityError> {
        let run_id = input.facts.run_id.clone();
        let work = self.deliver_all(&input);
        let forks = heartbeating(&ctx, work, || ()).await.map_err(|e| {
            tracing::warn!(run_id = %run_id, error = %e, "delivery not done; retried");
            ActivityError::from(anyhow::anyhow!(e))
        })?;
        Ok(DeliverDone { forks })
    }
}

impl DeliverLocal {
    async fn deliver_all(&self, input: &DeliverInput) -> Result<Vec<(u32, Delivered)>, String> {
        let url = if input.remote.is_empty() {
            &input.repo
        } else {
            &input.remote
        };
        let (changes, mut out) = self.changes(input, url).await?;
        if !changes.is_empty() {
            out.extend(self.push_changes(input, url, changes).await);
        }
        // A test's kill between the push and the pull requests (debug builds).
        forkyard_common::fault::point("deliver.after-push");
        self.open_pull_requests(input, &mut out).await;
        // A test's kill once the pull requests are open, before the run hears of them.
        forkyard_common::fault::point("deliver.after-pr");
        out.sort_by_key(|(fork, _)| *fork);
        Ok(out)
    }

    /// Each chosen fork's commit to make, or (beside) why it has none. `Err`: a fork's
    /// result could not be read (worth a retry of the whole activity).
    async fn changes(
        &self,
        input: &DeliverInput,
        url: &str,
    ) -> Result<(Vec<push::Change>, Vec<(u32, Delivered)>), String> {
        let (mut changes, mut refused) = (Vec::new(), Vec::new());
        for f in &input.forks {
            let full = (self.results)(input.facts.run_id.clone(), f.fork).await?;
            match change(input, f, &full) {
                Ok(c) => changes.push(c),
                Err(why) => refused.push((f.fork, failed(url, &f.branch, &why))),
            }
        }
        Ok((changes, refused))
    }

    /// The commits made and pushed to `url`, the base commits fetched from the run's
    /// repository: each fork's outcome.
    async fn push_changes(
        &self,
        input: &DeliverInput,
        url: &str,
        changes: Vec<push::Change>,
    ) -> Vec<(u32, Delivered)> {
        let branches: Vec<(u32, String)> =
            changes.iter().map(|c| (c.fork, c.branch.clone())).collect();
        let branch_of = |fork: u32| {
            let found = branches.iter().find(|(f, _)| *f == fork);
            found.map(|(_, b)| b.clone()).unwrap_or_default()
        };
        let accesses = async {
            let from = self.access(&input.tenant, &input.repo).await?;
            let to = if url == input.repo {
                None
            } else {
                Some(self.access(&input.tenant, url).await?)
            };
            Ok::<_, String>((from, to))
        };
        let (from, to) = match accesses.await {
            Ok(a) => a,
            Err(why) => {
                return branches
                    .iter()
                    .map(|(f, b)| (*f, failed(url, b, &why)))
                    .collect();
            }
        };
        let pushed = push::push(&from, to.as_ref().unwrap_or(&from), changes).await;
        pushed
            .into_iter()
            .map(|(fork, pushed)| {
                let d = match pushed {
                    Ok(commit) => Delivered {
                        remote: url.to_owned(),
                        branch: branch_of(fork),
                        commit,
                        ..Default::default()
                    },
                    Err(why) => failed(url, &branch_of(fork), &why),
                };
                (fork, d)
            })
            .collect()
    }

    /// How host git reaches the repository for `tenant`: its host admitted and its
    /// addresses checked now, the tenant's credential.
    async fn access(&self, tenant: &str, repo: &str) -> Result<push::Access, String> {
        let Ok(RepoLocation::Remote(remote)) = repo_location::locate(repo) else {
            return Err("only a remote repository is pushed to".into());
        };
        let addrs = self
            .repos
            .git_hosts
            .resolve(&remote.host, remote.port)
            .await
            .map_err(|e| format!("{} cannot be reached: {e}", remote.host))?;
        let credential = self.repos.credentials.resolve(tenant, &remote).await?;
        let pin = GitPin::new(repo, &remote, &addrs).await;
        Ok(push::Access {
            url: repo.to_owned(),
            env: pin.env(credential.map(|c| c.git_env(&remote)).unwrap_or_default()),
            pin: pin.args,
        })
    }

    /// The pull requests asked for, of the forks pushed: each fork's failure its own.
    async fn open_pull_requests(&self, input: &DeliverInput, out: &mut [(u32, Delivered)]) {
        let wanted = |fork: u32| input.forks.iter().any(|f| f.fork == fork && f.pull_request);
        if !out.iter().any(|(f, d)| wanted(*f) && !d.commit.is_empty()) {
            return;
        }
        let target = self.forge_target(input).await;
        for (fork, d) in out.iter_mut() {
            if !wanted(*fork) || d.commit.is_empty() || !d.error.is_empty() {
                continue;
            }
            let opened = match &target {
                Ok((access, path, base)) => pull_request(access, path, base, input, *fork, d).await,
                Err(why) => Err(why.clone()),
            };
            match opened {
                Ok(url) => d.pull_request_url = url,
                Err(why) => d.error = format!("pull request: {why}"),
            }
        }
    }

    /// The forge to open pull requests on, the repository's path there, and the branch
    /// they go against (the run's base branch, else the remote's default).
    async fn forge_target(
        &self,
        input: &DeliverInput,
    ) -> Result<(ForgeAccess, String, String), String> {
        let Ok(RepoLocation::Remote(remote)) = repo_location::locate(&input.repo) else {
            return Err("only a remote repository has pull requests".into());
        };
        let access = self
            .repos
            .credentials
            .forge_for(&input.tenant, &remote)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "no forge api for {} with tenant {}'s credentials (the operator names one in FORKYARD_GIT_CREDENTIALS: forge, api)",
                    remote.host, input.tenant
                )
            })?;
        let path = remote.path.clone().ok_or_else(|| {
            format!(
                "{} names no repository path",
                repo_location::shown(&input.repo)
            )
        })?;
        let base = if input.base_branch.is_empty() {
            let git = self.access(&input.tenant, &input.repo).await?;
            push::default_branch(&git).await?
        } else {
            input.base_branch.clone()
        };
        Ok((access, path, base))
    }
}

/// How many times a pull request is tried when the forge's API may answer later.
const PR_ATTEMPTS: u32 = 4;

/// Open (or find: a retried delivery's) the fork's pull request; its URL.
async fn pull_request(
    access: &ForgeAccess,
    path: &str,
    base: &str,
    input: &DeliverInput,
    fork: u32,
    d: &Delivered,
) -> Result<String, String> {
    let pr = PullRequest {
        head: d.branch.clone(),
        base: base.to_owned(),
        title: text::pr_title(&input.facts, fork),
        body: text::pr_body(&input.facts, fork),
        draft: input.draft,
    };
    let mut wait = std::time::Duration::from_secs(2);
    for attempt in 1..=PR_ATTEMPTS {
        match forge::open_pull_request(access, path, &pr).await {
            Ok(opened) => {
                tracing::info!(fork, url = %opened.url, existed = opened.existed, "pull request open");
                return Ok(opened.url);
            }
            Err(e) if e.is_retryable() && attempt < PR_ATTEMPTS => {
                tracing::warn!(fork, attempt, error = %e, "pull request not opened yet; retried");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    unreachable!("the last attempt returns")
}

fn failed(url: &str, branch: &str, why: &str) -> Delivered {
    Delivered {
        remote: url.to_owned(),
        branch: branch.to_owned(),
        error: why.to_owned(),
        ..Default::default()
    }
}

/// The fork's commit to make, or why it has none.
fn change(
    input: &DeliverInput,
    f: &DeliverFork,
    full: &ForkResult,
) -> Result<push::Change, String> {
    if full.patch_truncated {
        return Err(format!(
            "not pushed: the fork's patch was cut at {} bytes",
            full.patch.len()
        ));
    }
    if full.patch.trim().is_empty() {
        return Err("not pushed: the fork changed nothing".into());
    }
    if !is_commit_id(&full.base_commit) {
        return Err("not pushed: the fork has no base commit".into());
    }
    let message = if input.commit_message.trim().is_empty() {
        text::commit_message(&input.facts, f.fork)
    } else {
        input.commit_message.clone()
    };
    let or = |s: &str, d: &str| {
        if s.is_empty() {
            d.to_owned()
        } else {
            s.to_owned()
        }
    };
    Ok(push::Change {
        fork: f.fork,
        branch: f.branch.clone(),
        base_commit: full.base_commit.clone(),
        patch: full.patch.clone(),
        message,
        author: push::Signature {
            name: or(&input.author_name, "forkyard"),
            email: or(&input.author_email, "forkyard@localhost"),
            // The fork's end: the same on every retry, so the commit id is too.
            unix_secs: full.finished_unix_ms.max(0) / 1000,
        },
    })
}

fn is_commit_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}
