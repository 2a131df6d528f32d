//! A remote repository's workspace from a template: one clone per run, not one per fork.
//!
//! Each create first asks the remote, with the tenant's own credential, what its
//! `base_ref` is now (`git ls-remote`, held to the host's checked addresses like the
//! clone). That answer proves the tenant can read the repository *now* (a revoked or
//! rotated-away credential is refused here, with the FAILED_PRECONDITION a clone would
//! give, whatever the cache holds) and names the commit. The template is then keyed by
//! the tenant, the repository's URL and that commit, and built by one clone with the
//! tenant's credential (`crate::local::storage::template`'s build: the creates of a wave that
//! arrive together wait for the first one's build, then copy it), its submodules
//! checked out with the same tenant's credentials (`crate::local::storage::repo::submodules`); a
//! template made earlier is served only once each of its submodules' repositories has
//! answered the tenant too.
//!
//! Why the tenant is part of the key, rather than one template per URL and commit
//! shared by every tenant that passes the check: what one credential reads of a URL
//! is not always what another reads. A template holds everything its clone fetched:
//! every branch and tag the builder's credential was shown (servers hide refs per user:
//! Gerrit's ref permissions, hidden refs) and submodules from hosts where the builder had
//! a credential and another tenant may have none. Proving that a second tenant could
//! read all of that would take an `ls-remote` of every ref and every submodule, more
//! than the clone it would save; and the speed that matters is a run's forks, which
//! share a tenant. So two tenants on one repository clone it once each, and a tenant
//! never gets a byte its own credential did not fetch. The key's hash is SHA-256: a
//! caller chooses the URL, and must not be able to aim it at another tenant's key.
//!
//! Only `base_ref`s the remote can name take this path: empty or `HEAD`, a branch or
//! tag name (a tag first, as `git rev-parse` in a clone picks), or a full commit id
//! (the remote is asked only whether the tenant may read it; a commit the template's
//! clone lacks fails the build as the clone's checkout would). Expressions, abbreviated
//! ids and remote-tracking names are cloned per fork, as before. Templates of
//! repositories count toward the templates' size bound and are evicted like any
//! (`crate::local::storage::template`). A newer commit's template of the same tenant and URL
//! drops the older ones but those used in the last ten minutes: two runs of a tenant on
//! two branches of one repository would otherwise drop each other's template at each
//! create, and clone at each.

use crate::{
    error::{ProvisionerError, Result},
    git::Reach,
    local::storage::{
        repo::{
            git::{self, is_commit_id},
            submodules::{self, Reader, Submodule},
        },
        template::{SPARE, Templates},
    },
};
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How long the remote may take to name a commit.
const LS_REMOTE_TIMEOUT: Duration = Duration::from_secs(60);
/// The file of a remote template listing its submodules (`Vec<Submodule>` as JSON).
const SUBMODULES: &str = "submodules.json";

/// What a create's `base_ref` asks the remote for.
#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    /// Its default branch.
    Head,
    /// A full commit id (lower case).
    Commit(String),
    /// A tag, else a branch, of this name.
    Name(String),
    /// Something only a clone can tell (`HEAD~2`, an abbreviated id, `origin/x`).
    Unknown,
}

fn wanted(base_ref: &str) -> Wanted {
    let lower = base_ref.to_ascii_lowercase();
    if base_ref.is_empty() || base_ref == "HEAD" {
        Wanted::Head
    } else if is_commit_id(&lower) {
        Wanted::Commit(lower)
    } else if plain_name(base_ref) {
        Wanted::Name(base_ref.to_owned())
    } else {
        Wanted::Unknown
    }
}

/// A branch or tag name that `git rev-parse` in a fresh clone resolves exactly as the
/// remote's tag, else its branch, of that name: plain characters, no ref prefix of
/// the clone's own (`refs/`, `origin/`, …), no name git reads as `HEAD`'s kin, nothing
/// that could be an abbreviated commit id.
fn plain_name(name: &str) -> bool {
    const OWN: [&str; 5] = ["refs/", "origin/", "remotes/", "heads/", "tags/"];
    name.len() <= 255
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'/'))
        && !name.starts_with(['-', '.', '/'])
        && !name.ends_with(['/', '.'])
        && !name.contains("..")
        && !name.contains("//")
        && !name.ends_with(".lock")
        && !name.ends_with("HEAD")
        && !OWN.iter().any(|p| name.starts_with(p))
        && !name.bytes().all(|c| c.is_ascii_hexdigit())
}

impl Wanted {
    fn patterns(&self) -> Vec<String> {
        match self {
            Wanted::Name(n) => vec![
                format!("refs/tags/{n}"),
                format!("refs/tags/{n}^{{}}"),
                format!("refs/heads/{n}"),
            ],
            _ => vec!["HEAD".to_owned()],
        }
    }

    /// The commit `ls-remote`'s answer `out` names for it, if any.
    fn pick(&self, out: &str) -> Option<String> {
        let refs: Vec<(&str, &str)> = out
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter(|(id, _)| is_commit_id(id))
            .map(|(id, name)| (name, id))
            .collect();
        let find = |name: &str| {
            refs.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, id)| (*id).to_owned())
        };
        match self {
            Wanted::Head => find("HEAD"),
            Wanted::Commit(id) => Some(id.clone()),
            Wanted::Name(n) => find(&format!("refs/tags/{n}^{{}}"))
                .or_else(|| find(&format!("refs/tags/{n}")))
                .or_else(|| find(&format!("refs/heads/{n}"))),
            Wanted::Unknown => None,
        }
    }
}

/// The template of `req`, a remote repository's, and the commit the remote names for
/// its `base_ref` (built now if needed) once the tenant was shown to read it now;
/// `None`: a clone (the remote cannot name it, or the template cannot be built for a
/// reason of its own). `Err`: the tenant cannot read it, or a template cannot be built
/// for a reason a clone would share.
pub(crate) async fn template_of(
    templates: &Templates,
    reader: Reader<'_>,
    req: &CreateSandboxRequest,
    clone_timeout: Duration,
) -> Result<Option<(PathBuf, String)>> {
    let want = wanted(&req.base_ref);
    if want == Wanted::Unknown {
        return Ok(None);
    }
    let Some(reach) = reader.reach(&req.repo).await? else {
        return Ok(None);
    };
    let patterns = want.patterns();
    let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
    let timeout = LS_REMOTE_TIMEOUT.min(clone_timeout);
    let out = git::ls_remote(&req.repo, &patterns, &reach, timeout).await?;
    let Some(commit) = want.pick(&out) else {
        // No such branch or tag (or an empty repository): the clone says which.
        return Ok(None);
    };
    let owner = format!("tenant {:?} remote {:?}", req.tenant, req.repo);
    let (repo, at) = (&req.repo, &commit);
    let build =
        |dir: PathBuf| async move { build(&dir, repo, at, &reach, reader, clone_timeout).await };
    let made = templates.ensure_with(&owner, &commit, SPARE, build).await;
    let (dir, fresh) = match made {
        Ok(made) => made,
        Err(e @ (ProvisionerError::Internal(_) | ProvisionerError::Unavailable(_))) => {
            tracing::warn!(repo = %forkyard_common::repo_location::shown(&req.repo), error = %e, "workspace template cannot be built; cloning instead");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // A template built since this create asked read its submodules meanwhile.
    if !fresh {
        let subs = recorded(&dir)?;
        submodules::readable(&subs, reader, timeout).await?;
    }
    Ok(Some((dir, commit)))
}

/// A remote template's build into `dir`: one clone with the tenant's credential, its
/// submodules (recorded for later uses), settled.
async fn build(
    dir: &Path,
    repo: &str,
    commit: &str,
    reach: &Reach,
    reader: Reader<'_>,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let ws = dir.join("workspace");
    git::clone_detached(repo, commit, &ws, timeout, Some(reach)).await?;
    let subs = submodules::check_out(&ws, repo, reader, deadline).await?;
    let paths: Vec<String> = subs.iter().map(|s| s.path.clone()).collect();
    super::settle(&ws, &paths).await?;
    let json = serde_json::to_vec(&subs)
        .map_err(|e| ProvisionerError::internal("record submodules", e))?;
    std::fs::write(dir.join(SUBMODULES), json)
        .map_err(|e| ProvisionerError::internal("record submodules", e))
}

/// The submodules the template at `dir` was built with.
fn recorded(dir: &Path) -> Result<Vec<Submodule>> {
    let read = std::fs::read(dir.join(SUBMODULES))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
    // Without its list a template's submodules cannot be checked: not served.
    read.map_err(|e| ProvisionerError::internal("read the template's submodules", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_refs_the_remote_can_name() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(wanted(""), Wanted::Head);
        assert_eq!(wanted("HEAD"), Wanted::Head);
        assert_eq!(wanted(&id.to_uppercase()), Wanted::Commit(id.into()));
        for name in ["main", "release/1.2", "v1.0", "feature-x"] {
            assert_eq!(wanted(name), Wanted::Name(name.into()), "{name}");
        }
        for other in [
            "HEAD~1",
            "main^",
            "abc1234",
            "deadbeef",
            "origin/main",
            "refs/heads/main",
            "tags/v1",
            "FETCH_HEAD",
            "a..b",
            "-x",
            "x.lock",
            "a b",
            "@{u}",
        ] {
            assert_eq!(wanted(other), Wanted::Unknown, "{other}");
        }
    }

    #[test]
    fn the_remote_answer_names_a_tag_first_peeled() {
        let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
        let out = format!(
            "{a}\trefs/heads/v1\n{b}\trefs/tags/v1\n{c}\trefs/tags/v1^{{}}\n{a}\trefs/remotes/x/HEAD\n"
        );
        assert_eq!(Wanted::Name("v1".into()).pick(&out), Some(c.clone()));
        let light = format!("{a}\trefs/heads/v1\n{b}\trefs/tags/v1\n");
        assert_eq!(Wanted::Name("v1".into()).pick(&light), Some(b.clone()));
        assert_eq!(
            Wanted::Name("v1".into()).pick(&format!("{a}\trefs/heads/v1\n")),
            Some(a.clone())
        );
        assert_eq!(Wanted::Name("v2".into()).pick(&out), None);
        // Only HEAD itself, and only a commit id the remote sent as one.
        assert_eq!(Wanted::Head.pick(&out), None);
        assert_eq!(Wanted::Head.pick(&format!("{a}\tHEAD\n")), Some(a.clone()));
        assert_eq!(Wanted::Head.pick("../../x\tHEAD\n"), None);
    }
}
