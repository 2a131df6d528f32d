//! The core: sandbox lifecycle on the `local` (bubblewrap) backend. The gRPC service and
//! the Temporal activities are thin front doors over [`Provisioner`].

use crate::{
    bwrap::{self, Features, Invocation},
    entry::Entry,
    error::{ProvisionerError, Result},
    git,
    process::{self, Caps, Finished, Outcome},
    store::{self, Record, Store},
    validate,
};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, DestroySandboxRequest,
    DestroySandboxResponse, ExecRequest, ExecResponse, HealthCheckRequest, HealthCheckResponse,
    Sandbox,
};
use std::os::unix::fs::DirBuilderExt;
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};
use tracing::{info, warn};

pub const BACKEND: &str = "local";
/// Capture limit for an exec's stdout and for its stderr.
pub const OUTPUT_CAP: usize = 1024 * 1024;
/// Patch size limit when the request gives none.
pub const DEFAULT_PATCH_BYTES: u64 = 1024 * 1024;
/// Upper bound on a requested patch size, to bound memory.
pub const MAX_PATCH_BYTES: u64 = 64 * 1024 * 1024;
const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long destroy waits for killed commands to go before removing the workspace anyway.
const DESTROY_WAIT: Duration = Duration::from_secs(30);

/// Settings of the core (the binary fills them from flags; tests build them directly).
#[derive(Debug, Clone)]
pub struct Config {
    /// `<state>/sandboxes/<id>/` holds each sandbox.
    pub state_dir: PathBuf,
    /// The bubblewrap binary: a path or a name looked up on `$PATH`.
    pub bwrap_path: PathBuf,
    /// This replica's gRPC endpoint, stored as each sandbox's `owner_endpoint`.
    pub advertise_endpoint: String,
    /// Exec wall-clock limit when a request gives none.
    pub exec_timeout: Duration,
    /// Limit for cloning the repository.
    pub clone_timeout: Duration,
}

impl Config {
    pub fn new(state_dir: impl Into<PathBuf>, advertise_endpoint: impl Into<String>) -> Self {
        Self {
            state_dir: state_dir.into(),
            bwrap_path: "bwrap".into(),
            advertise_endpoint: advertise_endpoint.into(),
            exec_timeout: Duration::from_secs(600),
            clone_timeout: Duration::from_secs(300),
        }
    }
}

pub struct Provisioner {
    config: Config,
    bwrap: PathBuf,
    features: Features,
    store: Store,
    sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    /// One lock per idempotency key with a create in flight.
    creating: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Provisioner {
    /// Check bubblewrap works, then load the sandboxes a previous run left. Errors are
    /// configuration errors and name the setting.
    pub async fn open(config: Config) -> Result<Arc<Self>, String> {
        let bwrap = bwrap::resolve(&config.bwrap_path).ok_or_else(|| {
            format!(
                "FORKYARD_BWRAP_PATH (--bwrap-path) {}: no such executable",
                config.bwrap_path.display()
            )
        })?;
        let store = Store::open(&config.state_dir).map_err(|e| {
            format!(
                "FORKYARD_STATE_DIR (--state-dir) {}: {e}",
                config.state_dir.display()
            )
        })?;
        let features = bwrap::probe(&bwrap, store.root())
            .await
            .map_err(|e| format!("FORKYARD_BWRAP_PATH (--bwrap-path): {e}"))?;
        if !features.userns {
            warn!(bwrap = %bwrap.display(), "no user namespace available: sandboxes run without one");
        }
        let records = store.load_all().map_err(|e| {
            format!(
                "FORKYARD_STATE_DIR (--state-dir) {}: {e}",
                config.state_dir.display()
            )
        })?;
        let mut sandboxes = HashMap::new();
        for record in records {
            if record.destroying {
                info!(sandbox_id = %record.id, "finishing a destroy interrupted by a restart");
                if let Err(e) = store::remove_all(&store.dir(&record.id)) {
                    warn!(sandbox_id = %record.id, error = %e, "cannot remove sandbox");
                    sandboxes.insert(record.id.clone(), Entry::new(record));
                }
                continue;
            }
            sandboxes.insert(record.id.clone(), Entry::new(record));
        }
        info!(
            sandboxes = sandboxes.len(),
            ?features,
            "sandbox provisioner ready"
        );
        Ok(Arc::new(Self {
            config,
            bwrap,
            features,
            store,
            sandboxes: Mutex::new(sandboxes),
            creating: Mutex::new(HashMap::new()),
        }))
    }

    fn entry(&self, id: &str) -> Result<Arc<Entry>> {
        self.sandboxes
            .lock()
            .expect("sandboxes lock")
            .get(id)
            .cloned()
            .ok_or_else(|| ProvisionerError::NotFound(id.to_owned()))
    }

    fn by_key(&self, key: &str) -> Option<Sandbox> {
        let map = self.sandboxes.lock().expect("sandboxes lock");
        map.values()
            .find(|e| e.record.lock().expect("record lock").idempotency_key == key)
            .map(|e| e.snapshot())
    }

    pub async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        if !(req.backend.is_empty() || req.backend == BACKEND) {
            return Err(ProvisionerError::invalid(
                "backend",
                format!("{:?} is not served here (only \"local\")", req.backend),
            ));
        }
        if req.repo.trim().is_empty() {
            return Err(ProvisionerError::invalid("repo", "must not be empty"));
        }
        if req.network {
            // Sharing the host's network would expose every loopback service (this one,
            // Temporal) to the sandbox; network access arrives with the egress proxy.
            return Err(ProvisionerError::invalid(
                "network",
                "sandboxes have no network in this release (an egress allowlist proxy is planned)",
            ));
        }
        self.check_repo_location(&req.repo)?;
        git::check_branch(&req.branch).await?;
        if req.idempotency_key.is_empty() {
            return self.create_new(req).await;
        }
        let key_lock = {
            let mut creating = self.creating.lock().expect("creating lock");
            creating
                .entry(req.idempotency_key.clone())
                .or_default()
                .clone()
        };
        let result = {
            let _held = key_lock.lock().await;
            match self.by_key(&req.idempotency_key) {
                Some(existing) => {
                    info!(sandbox_id = %existing.id, "create repeated with the same idempotency key");
                    Ok(existing)
                }
                None => self.create_new(req.clone()).await,
            }
        };
        drop(key_lock);
        let mut creating = self.creating.lock().expect("creating lock");
        if creating
            .get(&req.idempotency_key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            creating.remove(&req.idempotency_key);
        }
        result
    }

    /// A local repository must not be one of this provisioner's own directories (other
    /// sandboxes' workspaces, its state).
    fn check_repo_location(&self, repo: &str) -> Result<()> {
        if repo.contains("://") || repo.starts_with("git@") {
            return Ok(());
        }
        let state = std::fs::canonicalize(&self.config.state_dir)
            .unwrap_or_else(|_| self.config.state_dir.clone());
        if let Ok(path) = std::fs::canonicalize(repo)
            && path.starts_with(&state)
        {
            return Err(ProvisionerError::invalid(
                "repo",
                "is inside the provisioner's state directory",
            ));
        }
        Ok(())
    }

    async fn create_new(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        let id = format!("sbx-{}", uuid::Uuid::new_v4().simple());
        let dir = self.store.dir(&id);
        // Owner-only: a file the agent made setuid in its workspace must not be
        // reachable by other users of the host.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ProvisionerError::internal("create sandbox directory", e))?;
        // Removes the directory unless the create completes (also if the caller hangs up).
        let mut cleanup = DirCleanup(Some(dir));
        let base_commit = git::clone(
            &req.repo,
            &req.base_ref,
            &req.branch,
            &self.store.workspace(&id),
            self.config.clone_timeout,
        )
        .await
        .inspect_err(|e| warn!(sandbox_id = %id, repo = %req.repo, error = %e, "create failed"))?;
        let record = Record {
            id: id.clone(),
            backend: BACKEND.to_owned(),
            destroying: false,
            labels: req.labels,
            branch: req.branch,
            base_commit,
            created_unix_ms: now_ms(),
            owner_endpoint: self.config.advertise_endpoint.clone(),
            idempotency_key: req.idempotency_key,
            network: req.network,
            repo: req.repo,
            base_ref: req.base_ref,
        };
        self.store.save(&record)?;
        cleanup.0 = None;
        let entry = Entry::new(record);
        let sandbox = entry.snapshot();
        self.sandboxes
            .lock()
            .expect("sandboxes lock")
            .insert(id.clone(), entry);
        info!(sandbox_id = %id, branch = %sandbox.branch, base_commit = %sandbox.base_commit, "sandbox created");
        Ok(sandbox)
    }

    pub fn get(&self, id: &str) -> Result<Sandbox> {
        Ok(self.entry(id)?.snapshot())
    }

    /// Sandboxes carrying every label of `selector`, oldest first.
    pub fn list(&self, selector: &HashMap<String, String>) -> Vec<Sandbox> {
        let mut out: Vec<Sandbox> = {
            let map = self.sandboxes.lock().expect("sandboxes lock");
            map.values().map(|e| e.snapshot()).collect()
        };
        out.retain(|s| selector.iter().all(|(k, v)| s.labels.get(k) == Some(v)));
        out.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
        out
    }

    pub async fn exec(&self, req: ExecRequest) -> Result<ExecResponse> {
        validate::argv(&req.argv)?;
        let mut env = Vec::with_capacity(req.env.len());
        for (k, v) in req.env {
            validate::env(&k, &v)?;
            env.push((k, v));
        }
        env.sort();
        let timeout = match req.timeout_secs {
            0 => self.config.exec_timeout,
            s => Duration::from_secs(s.into()),
        };
        let caps = Caps {
            stdout: OUTPUT_CAP,
            stderr: OUTPUT_CAP,
        };
        let f = self
            .run_in(&req.sandbox_id, &req.argv, &env, timeout, caps)
            .await?;
        let timed_out = matches!(f.outcome, Outcome::TimedOut);
        let exit_code = match f.outcome {
            Outcome::Exited { code } => code,
            _ => -1,
        };
        Ok(ExecResponse {
            exit_code,
            output_truncated: f.stdout.truncated() || f.stderr.truncated(),
            stdout: f.stdout.lossy(),
            stderr: f.stderr.lossy(),
            timed_out,
            duration_ms: u64::try_from(f.duration.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Run one command in a fresh bubblewrap over the sandbox's workspace.
    async fn run_in(
        &self,
        id: &str,
        argv: &[String],
        env: &[(String, String)],
        timeout: Duration,
        caps: Caps,
    ) -> Result<Finished> {
        let entry = self.entry(id)?;
        let Some(_guard) = entry.begin_exec() else {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {id} is being destroyed"
            )));
        };
        let network = entry.record.lock().expect("record lock").network;
        let workspace = self.store.workspace(id);
        let inv = Invocation {
            bwrap: &self.bwrap,
            features: self.features,
            workspace: &workspace,
            sandbox_id: id,
            network,
            argv,
            env,
        };
        let f = process::run(inv.command(), timeout, caps, &entry.cancel)
            .await
            .map_err(|e| ProvisionerError::internal("cannot start bwrap", e))?;
        if matches!(f.outcome, Outcome::Cancelled) {
            return Err(ProvisionerError::FailedPrecondition(format!(
                "sandbox {id} was destroyed while the command ran"
            )));
        }
        Ok(f)
    }

    pub async fn health(&self, req: HealthCheckRequest) -> Result<HealthCheckResponse> {
        let argv = ["test", "-d", "/workspace/.git"].map(String::from);
        let caps = Caps {
            stdout: 4096,
            stderr: 4096,
        };
        let (healthy, detail) = match self
            .run_in(&req.sandbox_id, &argv, &[], HEALTH_TIMEOUT, caps)
            .await
        {
            Ok(f) => match f.outcome {
                Outcome::Exited { code: 0 } => (
                    true,
                    format!(
                        "workspace visible, checked in {} ms",
                        f.duration.as_millis()
                    ),
                ),
                Outcome::Exited { code } => (
                    false,
                    format!("workspace check exited {code}: {}", f.stderr.lossy().trim()),
                ),
                Outcome::TimedOut | Outcome::Cancelled => {
                    (false, "workspace check did not finish".to_owned())
                }
            },
            Err(e @ ProvisionerError::Internal(_)) => (false, e.to_string()),
            Err(e) => return Err(e),
        };
        if !healthy {
            warn!(sandbox_id = %req.sandbox_id, detail = %detail, "sandbox unhealthy");
        }
        Ok(HealthCheckResponse { healthy, detail })
    }

    /// The workspace's changes against the base commit, computed by git inside the
    /// sandbox (the agent controls the repository: its hooks and config never run here).
    pub async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let id = &req.sandbox_id;
        let base = self.entry(id)?.record().base_commit;
        let max = match req.max_bytes {
            0 => DEFAULT_PATCH_BYTES,
            n => n.min(MAX_PATCH_BYTES),
        };
        let env = git::sandbox_env();
        let timeout = self.config.exec_timeout;
        let git = |args: &[&str]| -> Vec<String> {
            std::iter::once("git")
                .chain(args.iter().copied())
                .map(String::from)
                .collect()
        };
        let small = Caps {
            stdout: 64 * 1024,
            stderr: 64 * 1024,
        };
        let diff = [
            "diff",
            "--cached",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
        ];

        let staged = self
            .run_in(id, &git(&["add", "-A"]), &env, timeout, small)
            .await?;
        check_git(&staged, "git add")?;
        let patch_args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--binary", &base, "--"])
            .collect();
        let caps = Caps {
            stdout: usize::try_from(max).unwrap_or(usize::MAX),
            stderr: 64 * 1024,
        };
        let patch = self
            .run_in(id, &git(&patch_args), &env, timeout, caps)
            .await?;
        check_git(&patch, "git diff")?;
        let numstat_args: Vec<&str> = diff
            .iter()
            .copied()
            .chain(["--numstat", &base, "--"])
            .collect();
        let caps = Caps {
            stdout: 16 * 1024 * 1024,
            stderr: 64 * 1024,
        };
        let numstat = self
            .run_in(id, &git(&numstat_args), &env, timeout, caps)
            .await?;
        check_git(&numstat, "git diff --numstat")?;

        Ok(CollectPatchResponse {
            truncated: patch.stdout.truncated(),
            patch_bytes: patch.stdout.total,
            patch: patch.stdout.lossy(),
            diffstat: Some(git::parse_numstat(&numstat.stdout.lossy())),
            base_commit: base,
        })
    }

    /// Kill every command running in the sandbox, wait for them and remove it.
    pub async fn destroy(&self, req: DestroySandboxRequest) -> Result<DestroySandboxResponse> {
        let id = &req.sandbox_id;
        let Ok(entry) = self.entry(id) else {
            return Ok(DestroySandboxResponse { existed: false });
        };
        entry.execs.send_modify(|s| s.destroying = true);
        let record = {
            let mut r = entry.record.lock().expect("record lock");
            r.destroying = true;
            r.clone()
        };
        if let Err(e) = self.store.save(&record) {
            warn!(sandbox_id = %id, error = %e, "cannot mark sandbox as destroying on disk");
        }
        entry.cancel.cancel();
        let mut execs = entry.execs.subscribe();
        if tokio::time::timeout(DESTROY_WAIT, execs.wait_for(|s| s.running == 0))
            .await
            .is_err()
        {
            warn!(sandbox_id = %id, "commands still running after kill, removing the workspace anyway");
        }
        let dir = self.store.dir(id);
        tokio::task::spawn_blocking(move || store::remove_all(&dir))
            .await
            .map_err(|e| ProvisionerError::internal("remove sandbox", e))?
            .map_err(|e| ProvisionerError::internal("remove sandbox", e))?;
        self.sandboxes.lock().expect("sandboxes lock").remove(id);
        info!(sandbox_id = %id, reason = %req.reason, "sandbox destroyed");
        Ok(DestroySandboxResponse { existed: true })
    }
}

fn check_git(f: &Finished, what: &str) -> Result<()> {
    match f.outcome {
        Outcome::Exited { code: 0 } => Ok(()),
        Outcome::Exited { code } => Err(ProvisionerError::FailedPrecondition(format!(
            "{what} in the sandbox exited {code}: {}",
            f.stderr.lossy().trim()
        ))),
        _ => Err(ProvisionerError::Internal(format!(
            "{what} in the sandbox timed out"
        ))),
    }
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Removes a half-created sandbox directory when dropped while armed.
struct DirCleanup(Option<PathBuf>);

impl Drop for DirCleanup {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let remove = move || {
                if let Err(e) = store::remove_all(&dir) {
                    warn!(dir = %dir.display(), error = %e, "cannot remove half-created sandbox");
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(remove)),
                Err(_) => remove(),
            }
        }
    }
}
