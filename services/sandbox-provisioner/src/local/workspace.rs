//! A new sandbox's workspace: a copy of its repository's template (`crate::local::template`)
//! where there can be one, else a clone.

use crate::{
    error::{ProvisionerError, Result},
    local::{git, provisioner::Provisioner, store},
};
use forkyard_common::git_refs::local_commit;
use forkyard_proto::sandbox::v1::CreateSandboxRequest;
use std::path::{Path, PathBuf};

/// How a new sandbox's workspace is made: from a ready template, or by a clone.
pub(crate) enum Source {
    /// The template's directory and the commit it holds.
    Template(PathBuf, String),
    Clone,
}

impl Provisioner {
    /// Where the workspace of `req` comes from: the template when the repository allows
    /// (built now if needed), else a clone. A template that cannot be built is logged
    /// and cloned instead.
    pub(crate) async fn workspace_source(&self, req: &CreateSandboxRequest) -> Source {
        let Some(commit) = local_commit(&req.repo, &req.base_ref) else {
            return Source::Clone;
        };
        match self
            .templates
            .ensure(&req.repo, &commit, self.config.clone_timeout)
            .await
        {
            Ok(dir) => Source::Template(dir, commit),
            Err(e) => {
                tracing::warn!(repo = %req.repo, error = %e, "workspace template cannot be built; cloning instead");
                Source::Clone
            }
        }
    }

    /// The new sandbox's workspace at `ws` from `source`; `placed`: a warm copy of the
    /// template already renamed into place as the sandbox's directory.
    pub(crate) async fn make_workspace(
        &self,
        req: &CreateSandboxRequest,
        source: Source,
        ws: &Path,
        placed: Option<crate::local::template::WarmCopy>,
    ) -> Result<Made> {
        if let Source::Template(dir, commit) = source {
            let how = match placed {
                Some(_) => crate::metrics::Workspace::WarmCopy,
                None => crate::metrics::Workspace::TemplateCopy,
            };
            match self
                .templates
                .copy(dir, ws, &req.branch, &commit, placed)
                .await
            {
                Ok(copied) => {
                    return Ok(Made {
                        base_commit: commit,
                        index: copied.index,
                        uid: copied.uid,
                        how,
                    });
                }
                // A refused branch, or no sandbox uid free: a clone would end the same.
                Err(
                    e
                    @ (ProvisionerError::FailedPrecondition(_) | ProvisionerError::Unavailable(_)),
                ) => {
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(repo = %req.repo, error = %e, "workspace template copy failed; cloning instead");
                    let _ = store::remove_all(ws);
                }
            }
        }
        let base_commit = git::clone(
            &req.repo,
            &req.base_ref,
            &req.branch,
            ws,
            self.config.clone_timeout,
        )
        .await?;
        let index = crate::local::git_index::checksum_of(ws).unwrap_or_default();
        Ok(Made {
            base_commit,
            index,
            uid: 0,
            how: crate::metrics::Workspace::Clone,
        })
    }
}

/// A new workspace: its base commit, and the checksum of the index it was made with (a
/// template's copy or a clone: either way a checkout of the base; see
/// `store::Record::made_index`).
pub(crate) struct Made {
    pub(crate) base_commit: String,
    pub(crate) index: String,
    /// The sandbox uid its files were given already (a warm copy's); 0: none yet.
    pub(crate) uid: u32,
    /// How it was made (counted once the sandbox is registered).
    pub(crate) how: crate::metrics::Workspace,
}
