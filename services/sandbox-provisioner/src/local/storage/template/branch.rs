//! A new branch written into a template's copy: the files `git checkout -b` would
//! write, without starting git.

use super::warm_copy;
use crate::{
    error::{ProvisionerError, Result},
    local::{base::fs::write_in_place, isolation::uids},
};
use forkyard_common::git_refs::read_ref;
use std::{io, os::unix::fs::DirBuilderExt, path::Path};

/// Start `branch` at `commit` in a copied workspace: what `git checkout -b` writes
/// (the reflog aside). What it makes (the ref, directories of a branch like `team/x`)
/// is given to `uid`, or git in the sandbox could not update its own branch.
pub(crate) fn start_branch(ws: &Path, branch: &str, commit: &str, uid: Option<u32>) -> Result<()> {
    let git = ws.join(".git");
    let refs = git.join("refs/heads");
    if read_ref(&git, &format!("refs/heads/{branch}"), 0).is_some() {
        return Err(ProvisionerError::FailedPrecondition(format!(
            "cannot create branch {branch}: a branch named '{branch}' already exists"
        )));
    }
    if let Some(existing) = clash(&git, branch) {
        return Err(ProvisionerError::FailedPrecondition(format!(
            "cannot create branch {branch}: '{existing}' exists"
        )));
    }
    let file = refs.join(branch);
    let write = || -> io::Result<()> {
        let mut dir = refs.clone();
        for part in Path::new(branch)
            .parent()
            .into_iter()
            .flat_map(Path::components)
        {
            dir.push(part);
            match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
                Ok(()) => give(&dir, uid)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        // A warm copy's empty ref file, made ahead, becomes the branch's.
        let made_ahead = refs.join(warm_copy::BRANCH_FILE);
        match std::fs::OpenOptions::new().write(true).open(&made_ahead) {
            Ok(mut f) => {
                io::Write::write_all(&mut f, format!("{commit}\n").as_bytes())?;
                std::fs::rename(&made_ahead, &file)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::write(&file, format!("{commit}\n"))?;
                give(&file, uid)?;
            }
            Err(e) => return Err(e),
        }
        rewrite(
            &git.join("HEAD"),
            format!("ref: refs/heads/{branch}\n").as_bytes(),
        )
    };
    write().map_err(|e| ProvisionerError::internal("start branch", e))
}

/// A ref of `git` that `branch` cannot stand beside, as a ref cannot also be a directory
/// of refs: `main/x` beside `main` (packed or not), or `x` beside `x/y`, as
/// `git checkout -b` refuses (git would fail later, at gc).
fn clash(git: &Path, branch: &str) -> Option<String> {
    let refs = git.join("refs/heads");
    branch
        .match_indices('/')
        .map(|(i, _)| &branch[..i])
        .find(|prefix| read_ref(git, &format!("refs/heads/{prefix}"), 0).is_some())
        .map(|prefix| format!("refs/heads/{prefix}"))
        .or_else(|| {
            let under = format!(" refs/heads/{branch}/");
            let packed = std::fs::read_to_string(git.join("packed-refs")).unwrap_or_default();
            (refs.join(branch).is_dir() || packed.lines().any(|l| l.contains(&under)))
                .then(|| format!("refs/heads/{branch}/..."))
        })
}

fn give(path: &Path, uid: Option<u32>) -> io::Result<()> {
    uid.map_or(Ok(()), |uid| uids::chown(path, uid))
}

/// Overwrite `path` with `content` in place (`write_in_place`), or make it.
fn rewrite(path: &Path, content: &[u8]) -> io::Result<()> {
    match write_in_place(path, content) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::write(path, content),
        done => done,
    }
}
