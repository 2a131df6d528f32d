//! A new sandbox's workspace: a copy of its repository's template (`crate::local::storage::template`)
//! where there can be one, else a clone.

use crate::{
    error::{ProvisionerError, Result},
    local::{
        base::fs::remove_all,
        core::provisioner::Provisioner,
        storage::{
            layout::WORKSPACE,
            overlay,
            overlay::Hold,
            repo::{git, git_index, submodules},
            template,
            template::{WarmCopy, remote},
        },
    },
};
use forkyard_common::{
    git_refs::local_commit,
    repo_location::{self, RepoLocation},
};
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
    /// (built now if needed), else a clone. A local repository's template that cannot
    /// be built is logged and cloned instead; a remote repository's is first read with
    /// the tenant's credential (`crate::local::storage::template::remote`), whose refusal is the create's.
    pub(crate) async fn workspace_source(&self, req: &CreateSandboxRequest) -> Result<Source> {
        if let Ok(RepoLocation::Remote(_)) = repo_location::locate(&req.repo) {
            return self.remote_source(req).await;
        }
        let Some(commit) = local_commit(&req.repo, &req.base_ref) else {
            return Ok(Source::Clone);
        };
        match self
            .storage
            .templates
            .ensure(&req.repo, &commit, self.config.clone_timeout)
            .await
        {
            Ok(dir) => Ok(Source::Template(dir, commit)),
            Err(e) => {
                tracing::warn!(repo = %req.repo, error = %e, "workspace template cannot be built; cloning instead");
                Ok(Source::Clone)
            }
        }
    }

    /// Where the workspace of `req`, a remote repository's, comes from: its template
    /// at the commit the remote names for `base_ref` (built now if needed) once the
    /// tenant was shown to read it now, else a clone (`crate::local::storage::template::remote`).
    /// `Err`: the tenant cannot read it, or a template cannot be built for a reason a
    /// clone would share.
    async fn remote_source(&self, req: &CreateSandboxRequest) -> Result<Source> {
        let reader = self.reader(&req.tenant);
        let timeout = self.config.clone_timeout;
        Ok(
            match remote::template_of(&self.storage.templates, reader, req, timeout).await? {
                Some((dir, commit)) => Source::Template(dir, commit),
                None => Source::Clone,
            },
        )
    }

    /// The new sandbox's workspace at `ws` from `source`; `placed`: a warm copy of the
    /// template already renamed into place as the sandbox's directory.
    pub(crate) async fn make_workspace(
        &self,
        req: &CreateSandboxRequest,
        source: Source,
        ws: &Path,
        placed: Option<WarmCopy>,
    ) -> Result<Made> {
        if let Source::Template(dir, commit) = &source
            && placed.is_none()
            && self.storage.overlay_workspaces
            && let Some(made) = self.overlay_or_fall_back(req, dir, commit, ws).await?
        {
            return Ok(made);
        }
        if let Source::Template(dir, commit) = source
            && let Some(made) = self.template_copy(req, dir, commit, ws, placed).await?
        {
            return Ok(made);
        }
        self.clone_workspace(req, ws).await
    }

    /// An overlay of template `dir` ([`Self::overlay_workspace`]); `None`: it failed for
    /// a reason a copy may not share, and what it made is gone.
    async fn overlay_or_fall_back(
        &self,
        req: &CreateSandboxRequest,
        dir: &Path,
        commit: &str,
        ws: &Path,
    ) -> Result<Option<Made>> {
        match self.overlay_workspace(req, dir, commit, ws).await {
            Ok(made) => Ok(Some(made)),
            Err(
                e @ (ProvisionerError::FailedPrecondition(_) | ProvisionerError::Unavailable(_)),
            ) => Err(e),
            Err(e) => {
                tracing::warn!(repo = %req.repo, error = %e, "overlay workspace failed; copying the template instead");
                if let Some(sandbox) = ws.parent() {
                    overlay::remove_layers(sandbox);
                }
                Ok(None)
            }
        }
    }

    /// A copy of template `dir` at `ws` on the new branch (`placed`'s, when a warm copy
    /// is in place already); `None`: it failed for a reason a clone may not share, and
    /// what it made is gone.
    async fn template_copy(
        &self,
        req: &CreateSandboxRequest,
        dir: PathBuf,
        commit: String,
        ws: &Path,
        mut placed: Option<WarmCopy>,
    ) -> Result<Option<Made>> {
        let mut how = match placed {
            Some(_) => crate::metrics::Workspace::WarmCopy,
            None => crate::metrics::Workspace::TemplateCopy,
        };
        let warm_overlay = self.adopt_warm_overlay(&mut placed, ws)?;
        if warm_overlay.is_some() {
            how = crate::metrics::Workspace::WarmOverlay;
        }
        // Held across the copy: the path names the mount's descriptor.
        let held = warm_overlay
            .as_ref()
            .map(|(id, _)| self.storage.store.workspace(id));
        let at = held.as_deref().unwrap_or(ws);
        let copied = self
            .storage
            .templates
            .copy(dir, at, &req.branch, &commit, placed)
            .await;
        if copied.is_err()
            && let Some((id, _)) = &warm_overlay
        {
            self.storage.store.overlays().remove(id);
            if let Some(sandbox) = ws.parent() {
                overlay::remove_layers(sandbox);
            }
        }
        match copied {
            Ok(copied) => Ok(Some(Made {
                base_commit: commit,
                index: copied.index,
                uid: copied.uid,
                how,
                hold: warm_overlay.as_ref().map(|(id, _)| {
                    Hold::new(self.storage.store.overlays().clone(), id.clone(), None)
                }),
                overlay: warm_overlay.map(|(_, lower)| lower),
            })),
            // A refused branch, or no sandbox uid free: a clone would end the same.
            Err(
                e @ (ProvisionerError::FailedPrecondition(_) | ProvisionerError::Unavailable(_)),
            ) => Err(e),
            Err(e) => {
                tracing::warn!(repo = %req.repo, error = %e, "workspace template copy failed; cloning instead");
                let _ = remove_all(ws);
                Ok(None)
            }
        }
    }

    /// A warm overlay's mount, the sandbox's now (its branch is written through it): its
    /// id and lower layer.
    fn adopt_warm_overlay(
        &self,
        placed: &mut Option<WarmCopy>,
        ws: &Path,
    ) -> Result<Option<(String, PathBuf)>> {
        let Some((mount, lower)) = placed.as_mut().and_then(|w| w.mount.take()) else {
            return Ok(None);
        };
        let id = sandbox_id(ws)?;
        self.storage
            .store
            .overlays()
            .insert(&id, mount, lower.clone());
        Ok(Some((id, lower)))
    }

    /// A clone of `req`'s repository at `ws`, its submodules checked out with the
    /// tenant's credentials where it is a remote one.
    async fn clone_workspace(&self, req: &CreateSandboxRequest, ws: &Path) -> Result<Made> {
        let reader = self.reader(&req.tenant);
        let reach = reader.reach(&req.repo).await?;
        let deadline = std::time::Instant::now() + self.config.clone_timeout;
        let base_commit = git::clone(
            &req.repo,
            &req.base_ref,
            &req.branch,
            ws,
            self.config.clone_timeout,
            reach.as_ref(),
        )
        .await?;
        if reach.is_some() {
            submodules::check_out(ws, &req.repo, reader, deadline).await?;
        }
        let index = git_index::checksum_of(ws).unwrap_or_default();
        Ok(Made {
            base_commit,
            index,
            uid: 0,
            how: crate::metrics::Workspace::Clone,
            overlay: None,
            hold: None,
        })
    }
}

impl Provisioner {
    /// The new sandbox's workspace an overlay of template `dir` (`crate::local::storage::overlay`)
    /// on new branch `req.branch`; `ws` is the sandbox's `workspace` directory (the mount
    /// point its processes get it on). Registered with the store as the sandbox's.
    async fn overlay_workspace(
        &self,
        req: &CreateSandboxRequest,
        dir: &Path,
        commit: &str,
        ws: &Path,
    ) -> Result<Made> {
        let id = sandbox_id(ws)?;
        let sandbox = ws.parent().unwrap_or(ws).to_path_buf();
        let held = WarmCopy::holding_uid(sandbox.clone(), self.storage.templates.uids())?;
        let (store, lower) = (self.storage.store.clone(), dir.join(WORKSPACE));
        let uids = self.storage.templates.uids().cloned();
        let (branch, commit) = (req.branch.clone(), commit.to_owned());
        tokio::task::spawn_blocking(move || {
            let Some(uid) = held.uid() else {
                return Err(ProvisionerError::internal(
                    "overlay workspace",
                    "no sandbox uid",
                ));
            };
            overlay::make_layers(&sandbox, uid)
                .and_then(|()| store.overlays().mount(&id, &lower, &sandbox, uid))
                .map_err(|e| ProvisionerError::internal("mount the overlay workspace", e))?;
            // The branch is written through the mount, as root: what it makes lands in the
            // upper layer and is given to the sandbox's uid.
            if let Err(e) =
                template::start_branch(&store.workspace(&id), &branch, &commit, Some(uid))
            {
                store.overlays().remove(&id);
                return Err(e);
            }
            let index = git_index::checksum_of(&lower).unwrap_or_default();
            let (_, uid) = held.keep_uid();
            // Made: a create that was given up meanwhile lets the mount and the uid go.
            let hold = Hold::new(store.overlays().clone(), id, uids.map(|u| (uid, u)));
            Ok(Made {
                base_commit: commit,
                index,
                uid,
                how: crate::metrics::Workspace::Overlay,
                overlay: Some(lower),
                hold: Some(hold),
            })
        })
        .await
        .map_err(|e| ProvisionerError::internal("overlay workspace", e))?
    }
}

/// The id of the sandbox whose workspace directory is `ws` (`<sandboxes>/<id>/workspace`).
fn sandbox_id(ws: &Path) -> Result<String> {
    ws.parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| ProvisionerError::internal("overlay workspace", "no sandbox id"))
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
    /// An overlay's lower layer (`store::Record::overlay`).
    pub(crate) overlay: Option<PathBuf>,
    /// An overlay's mount (and uid), let go unless the sandbox is registered.
    pub(crate) hold: Option<Hold>,
}
