//! `LaunchRun`'s repository check: the repository answers, and its base ref names a
//! commit (asked of git only where its ref files cannot tell).

use crate::error::GatewayError;
use std::time::Duration;

/// The repository must exist and answer `git ls-remote`; a local path that does not
/// exist is bad input, a repository that cannot be reached is a failed precondition.
pub async fn check_repo(repo: &str, base_ref: &str) -> Result<(), GatewayError> {
    check_head(repo).await?;
    if base_ref.is_empty() || base_ref == "HEAD" {
        return Ok(());
    }
    if !looks_remote(repo) {
        if forkyard_common::git_refs::local_commit(repo, base_ref).is_some() {
            return Ok(());
        }
        // A tag, an abbreviated id or an expression (HEAD~2): only git can tell.
        let spec = format!("{base_ref}^{{commit}}");
        let out = git(&[
            "-C",
            repo,
            "-c",
            "core.fsmonitor=false",
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &spec,
        ])
        .await?;
        return if out.status.success() {
            Ok(())
        } else {
            Err(GatewayError::field(
                "base_ref",
                format!("{base_ref:?} names no commit in {repo}"),
            ))
        };
    }
    // A remote is asked for branches and tags of that name; a commit id cannot be
    // checked short of cloning, and is taken as given.
    if base_ref.len() >= 7 && base_ref.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    let out = git(&["ls-remote", "--quiet", "--exit-code", "--", repo, base_ref]).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(GatewayError::field(
            "base_ref",
            format!("{base_ref:?} is no branch or tag of {repo}"),
        ))
    }
}

/// Host git with the caller-chosen repository: no prompts, no user or system config.
async fn git(args: &[&str]) -> Result<std::process::Output, GatewayError> {
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("git")
            .args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ALLOW_PROTOCOL", "file:git:http:https:ssh")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| GatewayError::FailedPrecondition("repo: git did not answer within 30 s".into()))?
    .map_err(|e| GatewayError::Internal(format!("cannot run git: {e}")))
}

fn looks_remote(repo: &str) -> bool {
    repo.contains("://") || repo.starts_with("git@")
}

async fn check_head(repo: &str) -> Result<(), GatewayError> {
    let looks_remote = looks_remote(repo);
    if !looks_remote && !std::path::Path::new(repo).exists() {
        return Err(GatewayError::field(
            "repo",
            format!("{repo:?} does not exist (not a URL and no such path)"),
        ));
    }
    // A local repository whose HEAD resolves from its ref files answers as `git
    // ls-remote` would, without two git processes (about 6 ms on every LaunchRun's
    // way); anything else (a URL, a repository only git can read) asks git.
    if !looks_remote && forkyard_common::git_refs::local_commit(repo, "HEAD").is_some() {
        return Ok(());
    }
    let out = git(&["ls-remote", "--quiet", "--exit-code", "--", repo, "HEAD"]).await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no HEAD (empty repository?)");
        return Err(GatewayError::FailedPrecondition(format!(
            "repo: {repo:?} cannot be cloned: {}",
            reason.trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[tokio::test]
    async fn missing_local_repo_is_invalid_argument() {
        let err = check_repo("/nonexistent/forkyard/repo", "")
            .await
            .unwrap_err();
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("repo"));
    }

    #[tokio::test]
    async fn a_directory_that_is_not_a_repo_is_failed_precondition() {
        let dir = tempfile::tempdir().unwrap();
        let status = tonic::Status::from(
            check_repo(dir.path().to_str().unwrap(), "")
                .await
                .unwrap_err(),
        );
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    }

    #[tokio::test]
    async fn base_refs_must_name_a_commit_of_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().to_str().unwrap();
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .args(["-C", repo])
                .args(args)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q", "-b", "main"]);
        git(&["commit", "-q", "--allow-empty", "-m", "one"]);
        git(&["commit", "-q", "--allow-empty", "-m", "two"]);
        git(&["tag", "v1"]);
        for good in ["", "HEAD", "main", "v1", "HEAD~1", "main^"] {
            assert!(check_repo(repo, good).await.is_ok(), "{good}");
        }
        for bad in ["nope", "HEAD~5", "v2"] {
            let e = tonic::Status::from(check_repo(repo, bad).await.unwrap_err());
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
            assert!(e.message().starts_with("base_ref"), "{e:?}");
        }
        for bad in ["-x", "--upload-pack=x", "a b", "a\nb"] {
            assert!(crate::validate::check_base_ref(bad).is_err(), "{bad:?}");
        }
    }
}
