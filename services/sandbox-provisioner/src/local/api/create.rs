//! Creating a sandbox on the `local` backend: admission, its directory and workspace
//! (template copy, clone or snapshot), its record, registration.

use crate::{
    error::{ProvisionerError, Result},
    git,
    limits::now_ms,
    local::{
        api::workspace,
        base::fs::remove_all,
        core::{
            entry::Entry,
            provisioner::{BACKEND, DirCleanup, Provisioner},
        },
        isolation::{Kind, cgroup::Limits, network::egress::Allowlist, uids},
        storage::{overlay, repo::git_dirs, store, store::Record},
    },
};
use forkyard_proto::sandbox::v1::{CreateSandboxRequest, DestroySandboxRequest, Sandbox};
use std::{path::Path, sync::Arc, time::Duration};
use tracing::{info, warn};

impl Provisioner {
    /// Create a sandbox. The work runs on a task of its own, to the end: a caller that
    /// hangs up midway (a gateway killed during a wave) cannot cut a create between its
    /// blocking file steps and its cleanup, which left half-made directories no list
    /// showed. A sandbox made for a caller that is gone is kept when it has an idempotency
    /// key (the caller's retry gets it) and destroyed when it has none (nobody can learn
    /// its id).
    pub async fn create(self: &Arc<Self>, req: CreateSandboxRequest) -> Result<Sandbox> {
        let core = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let keyed = !req.idempotency_key.is_empty();
            let out = core.create_to_the_end(req).await;
            if let Ok(sandbox) = &out {
                core.boot_in_background(&sandbox.id);
            }
            if let Err(Ok(sandbox)) = tx.send(out)
                && !keyed
            {
                warn!(sandbox_id = %sandbox.id, "the caller hung up during the create: sandbox destroyed");
                let _ = core
                    .destroy(DestroySandboxRequest {
                        sandbox_id: sandbox.id,
                        reason: "its creator hung up before the create ended".into(),
                    })
                    .await;
            }
        });
        rx.await
            .map_err(|e| ProvisionerError::internal("create sandbox", e))?
    }

    async fn create_to_the_end(&self, mut req: CreateSandboxRequest) -> Result<Sandbox> {
        self.refuse_if_draining(&req)?;
        if !(req.backend.is_empty() || req.backend == BACKEND) {
            return Err(ProvisionerError::invalid(
                "backend",
                format!("{:?} is not served here (only \"local\")", req.backend),
            ));
        }
        self.check_network(&req)?;
        self.check_isolation(&req.isolation).await?;
        if let Some(l) = &req.limits {
            crate::validate::limits(l)?;
        }
        self.config.maxima.check(&req)?;
        if req.snapshot_id.is_empty() {
            if req.repo.trim().is_empty() {
                return Err(ProvisionerError::invalid("repo", "must not be empty"));
            }
            req.repo = self.admit_repo(&req.repo)?;
            git::check_branch(&req.branch).await?;
            // A remote host that cannot be reached is refused before anything is made;
            // the clone checks again, held to the addresses it then finds.
            let creds = &self.config.git_credentials;
            git::reach(&self.config.git_hosts, creds, &req.tenant, &req.repo).await?;
        }
        if req.idempotency_key.is_empty() {
            let out = self.create_new(req).await;
            crate::metrics::created(BACKEND, &out);
            return out;
        }
        let _held = self.creating.lock(req.idempotency_key.clone()).await;
        match self.by_key(&req.idempotency_key) {
            Some(existing) => {
                info!(sandbox_id = %existing.id, "create repeated with the same idempotency key");
                Ok(existing)
            }
            None => {
                let out = self.create_new(req).await;
                crate::metrics::created(BACKEND, &out);
                out
            }
        }
    }

    /// Network only through the egress allowlist proxy: a sandbox never shares the host's
    /// network (every loopback service, this one and Temporal included, would be exposed).
    pub(crate) fn check_network(&self, req: &CreateSandboxRequest) -> Result<()> {
        if req.network && req.egress_allow.is_empty() {
            return Err(ProvisionerError::invalid(
                "network",
                "unrestricted network is not offered; list the reachable hosts in egress_allow",
            ));
        }
        let list = Allowlist::parse(&req.egress_allow)
            .map_err(|e| ProvisionerError::invalid("egress_allow", e))?;
        if let Some(bad) = list
            .private_entries()
            .into_iter()
            .find(|(_, ip)| ip.is_none_or(|ip| !self.config.egress_private_allowed.contains(&ip)))
        {
            return Err(ProvisionerError::invalid(
                "egress_allow",
                format!(
                    "{} is a loopback, link-local or private address: a sandbox must not reach the host's or the mesh's own services (the operator can allow an address with FORKYARD_EGRESS_PRIVATE_ALLOWED)",
                    bad.0
                ),
            ));
        }
        if !req.egress_allow.is_empty() && self.config.forwarder_path.is_none() {
            return Err(ProvisionerError::FailedPrecondition(
                "egress is not available: the provisioner has no egress forwarder configured"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Try runsc now, in the background, so that the first launch's ListBackends (and
    /// the first gVisor create) finds the answer instead of waiting for the probe (a
    /// gVisor container started and stopped). Where gVisor cannot run it answers at once.
    pub fn probe_isolations_in_background(self: &std::sync::Arc<Self>) {
        let core = self.clone();
        tokio::spawn(async move {
            let _ = core.check_isolation("gvisor").await;
        });
    }

    /// A create's `isolation`: a level this crate knows, and gVisor only where runsc runs
    /// sandboxes here (tried once) under a sandbox init (what gVisor's container holds):
    /// never quietly bubblewrap instead.
    pub(crate) async fn check_isolation(&self, isolation: &str) -> Result<()> {
        let kind = Kind::parse(isolation).map_err(|e| ProvisionerError::invalid("isolation", e))?;
        if kind == Kind::Bubblewrap {
            return Ok(());
        }
        if self.isolation.forwarder.is_none() || !self.config.sandbox_init {
            return Err(ProvisionerError::FailedPrecondition(
                "isolation \"gvisor\" is not available here: it runs each sandbox's commands under the sandbox's init, which needs the egress forwarder (FORKYARD_EGRESS_FORWARDER) and FORKYARD_SANDBOX_INIT on".into(),
            ));
        }
        self.isolation
            .gvisor
            .ready()
            .await
            .map(drop)
            .map_err(|why| {
                ProvisionerError::FailedPrecondition(format!(
                    "isolation \"gvisor\" is not available here: {why}"
                ))
            })
    }

    /// The record a new sandbox starts with (workspace not yet made).
    pub(crate) fn new_record(
        &self,
        id: &str,
        req: &CreateSandboxRequest,
        base_commit: String,
        image: Option<store::SandboxImage>,
    ) -> Record {
        let d = self.config.default_limits;
        let l = req.limits.unwrap_or_default();
        let pick = |v: u64, default: u64| if v == 0 { default } else { v };
        let ttl = match req.ttl_secs {
            0 => self.config.default_ttl,
            s => Duration::from_secs(s.into()),
        };
        let now = now_ms();
        Record {
            id: id.to_owned(),
            backend: BACKEND.to_owned(),
            destroying: false,
            labels: req.labels.clone(),
            branch: req.branch.clone(),
            base_commit,
            created_unix_ms: now,
            owner_endpoint: self.config.advertise_endpoint.clone(),
            owner_task_queue: self.config.owner_task_queue.clone(),
            idempotency_key: req.idempotency_key.clone(),
            network: req.network || !req.egress_allow.is_empty(),
            repo: req.repo.clone(),
            base_ref: req.base_ref.clone(),
            limits: Limits {
                memory_bytes: pick(l.memory_bytes, d.memory_bytes),
                pids: pick(l.pids.into(), d.pids),
                cpu_millis: pick(l.cpu_millis.into(), d.cpu_millis),
            },
            disk_bytes: self.disk_bytes_for(req),
            egress_allow: req.egress_allow.clone(),
            expires_unix_ms: if ttl.is_zero() {
                0
            } else {
                now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
            },
            stopped: false,
            workspace_bytes: 0,
            memory_mib_ms: 0,
            // Given at register (`crate::local::isolation::uids`).
            uid: 0,
            image,
            made_index: String::new(),
            overlay: None,
            // Checked at the create's admission (`Self::check_isolation`).
            isolation: Kind::parse(&req.isolation).unwrap_or_default(),
        }
    }

    /// Save `record` (its workspace is complete), start its egress proxy, and register
    /// it (its cgroups come with its first command: [`Self::ensure_cgroups`]). The
    /// record's file is written on a blocking thread: on a busy filesystem a new file can
    /// take milliseconds, and this replica's async threads answer every other call (a
    /// wave's health checks among them) meanwhile. Nothing after that wait can be
    /// interrupted, so a caller hanging up there leaves nothing behind (its directory
    /// goes with the create's cleanup).
    pub(crate) async fn register(&self, mut record: Record) -> Result<Sandbox> {
        let id = record.id.clone();
        // A warm copy's workspace comes with its uid, given to it already.
        let given = record.uid != 0;
        if let Some(uids) = &self.isolation.uids
            && !given
        {
            record.uid = uids.claim()?;
        }
        let (store, saved) = (self.storage.store.clone(), record.clone());
        let made = tokio::task::spawn_blocking(move || {
            if saved.uid != 0 && !given {
                uids::give_workspace(&store.workspace(&saved.id), saved.uid)
                    .map_err(|e| ProvisionerError::internal("give the workspace to its uid", e))?;
            }
            store.save_new(&saved)
        })
        .await
        .map_err(|e| ProvisionerError::internal("register sandbox", e))
        .and_then(|r| r);
        if let Err(e) = made {
            self.release_uid(record.uid);
            return Err(e);
        }
        let entry = Entry::new(record);
        if let Err(e) = self.activate(&entry) {
            self.release_uid(entry.record().uid);
            entry.cancel.cancel();
            if let Some(cg) = &self.isolation.cgroups {
                cg.remove(&id);
            }
            let _ = remove_all(&self.storage.store.dir(&id));
            return Err(e);
        }
        let sandbox = entry.snapshot();
        self.sandboxes
            .lock()
            .expect("sandboxes lock")
            .insert(id.clone(), entry);
        info!(sandbox_id = %id, branch = %sandbox.branch, base_commit = %sandbox.base_commit, "sandbox created");
        Ok(sandbox)
    }

    /// The repository to clone: a URL as given, a local path (plain or `file://`)
    /// resolved, and never one inside this replica's sandboxes, templates, trash or
    /// snapshots (another sandbox's work, and a repository an agent has modified).
    /// `repo` as a create of any backend may name it: no credentials in it, a remote
    /// one's host allowed, a local one's path outside the provisioner's own data (the
    /// path canonical, as returned).
    pub(crate) fn admit_repo(&self, repo: &str) -> Result<String> {
        if forkyard_common::repo_location::carries_credentials(repo) {
            // Not echoed: the part a caller put there is often a token.
            return Err(ProvisionerError::invalid(
                "repo",
                "must not carry credentials (a user name or token in the URL): the mesh holds each host's (FORKYARD_GIT_CREDENTIALS)",
            ));
        }
        self.check_repo_location(repo)
    }

    fn check_repo_location(&self, repo: &str) -> Result<String> {
        use forkyard_common::repo_location::{self, RepoLocation};
        let path = match repo_location::locate(repo.trim()) {
            Ok(RepoLocation::Remote(remote)) => {
                crate::git::check_repo_host(&self.config.git_hosts, &remote)?;
                return Ok(repo.to_owned());
            }
            Ok(RepoLocation::Local(path)) => path,
            Err(why) => return Err(ProvisionerError::invalid("repo", why)),
        };
        let Ok(path) = repo_location::canonical_local(&path) else {
            return Err(ProvisionerError::RepoUnavailable(format!(
                "cannot clone {repo}: no such path on this host"
            )));
        };
        let mut protected = repo_location::sandbox_data_dirs(&self.config.state_dir);
        protected.push(self.config.snapshot_dir.clone());
        if protected.iter().any(|d| repo_location::is_within(&path, d)) {
            return Err(ProvisionerError::invalid(
                "repo",
                "is inside the provisioner's state directory (sandboxes, templates, snapshots)",
            ));
        }
        // What git would read through the path: a `.git` file, a worktree's common
        // directory, alternates (`crate::local::storage::repo::git_dirs`).
        let reads = git_dirs::read_by_clone(&path);
        if reads
            .iter()
            .any(|g| protected.iter().any(|d| repo_location::is_within(g, d)))
        {
            return Err(ProvisionerError::invalid(
                "repo",
                "leads git into the provisioner's state directory (a .git file, worktree or alternates naming sandboxes' or templates' repositories)",
            ));
        }
        path.into_os_string()
            .into_string()
            .map_err(|_| ProvisionerError::invalid("repo", "resolves to a path that is not UTF-8"))
    }

    async fn create_new(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        // First: an image that cannot be used leaves nothing behind.
        let image = self.resolve_image(&req.image).await?;
        if !req.snapshot_id.is_empty() {
            return self.create_from_snapshot(req, image).await;
        }
        let id = format!("sbx-{}", uuid::Uuid::new_v4().simple());
        let dir = self.storage.store.dir(&id);
        let source = self.workspace_source(&req).await?;
        // A template's sandbox makes all of its files (directory, workspace, record,
        // cgroups) in one turn, so a wave's creates finish one after the other in arrival
        // order, and the replica runs a bounded number of blocking threads: with every
        // create's file steps queued at once, a wave's sandboxes were all ready only with
        // the last, and the health checks in between waited behind a hundred threads.
        let _turn = match &source {
            workspace::Source::Template(..) => Some(self.storage.templates.turn().await?),
            workspace::Source::Clone => None,
        };
        // The sandbox's directory made ahead, with its workspace (`template::warm`).
        let placed = match &source {
            workspace::Source::Template(template, _) => {
                self.storage.templates.take(template, &dir).await
            }
            workspace::Source::Clone => None,
        };
        if placed.is_none() {
            self.make_sandbox_dir(&dir, &req).await?;
        }
        // Removes the directory unless the create completes (also if the caller hangs up).
        let mut cleanup = DirCleanup(Some(dir));
        // Its directory: an overlay is registered only once made.
        let ws = self.storage.store.mountpoint(&id);
        let made = self
            .make_workspace(&req, source, &ws, placed)
            .await
            .inspect_err(
                |e| warn!(sandbox_id = %id, repo = %req.repo, error = %e, "create failed"),
            )?;
        let mut record = self.new_record(&id, &req, made.base_commit, image);
        record.made_index = made.index;
        record.uid = made.uid;
        record.overlay = made.overlay;
        // An overlay's mount goes with the directory unless the register completes; its
        // uid is the register's to give back from here.
        let hold = made.hold.map(overlay::Hold::uid_registered);
        let sandbox = self.register(record).await?;
        if let Some(hold) = hold {
            hold.kept();
        }
        cleanup.0 = None;
        crate::metrics::workspace_made(made.how);
        Ok(sandbox)
    }

    /// A request's disk bound: its own, or the replica's default (0 = unbounded).
    pub(crate) fn disk_bytes_for(&self, req: &CreateSandboxRequest) -> u64 {
        match req.limits.map(|l| l.disk_bytes) {
            Some(n) if n > 0 => n,
            _ => self.config.default_disk_bytes,
        }
    }

    /// A new sandbox's directory `<state>/sandboxes/<id>`: a subvolume with its quota
    /// where there are quotas, a plain directory otherwise.
    pub(crate) async fn make_sandbox_dir(
        &self,
        dir: &Path,
        req: &CreateSandboxRequest,
    ) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt as _;
        let (dir, mode, quota) = (
            dir.to_path_buf(),
            self.sandbox_dir_mode(),
            self.storage.disk_quota.clone(),
        );
        let disk_bytes = self.disk_bytes_for(req);
        tokio::task::spawn_blocking(move || match quota {
            Some(q) => q.make_dir(&dir, disk_bytes, mode),
            None => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(&dir),
        })
        .await
        .map_err(|e| ProvisionerError::internal("create sandbox directory", e))?
        .map_err(|e| ProvisionerError::internal("create sandbox directory", e))
    }
}
