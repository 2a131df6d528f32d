//! The `e2b` backend: a client for E2B's control-plane REST API (create / get / list /
//! kill / timeout / pause / resume, header `X-API-KEY`) and for envd, the daemon inside
//! each sandbox (Connect-RPC `process.Process/Start` for commands with streamed output,
//! `GET/POST /files` for files). Sandbox ids are `e2b-<E2B sandboxID>`.
//!
//! The API key comes only from `E2B_API_KEY`; [`ApiKey`] never prints it (Debug and
//! Display are redacted) and error bodies are scrubbed of it before they become errors.
//!
//! This file holds the backend's state; by concern, the rest: `backend` (its
//! `SandboxBackend` methods), `create`, `config` (settings, the key), `api` (the control
//! plane and its errors), `envd` (commands in a sandbox), `files`, `seed` (the
//! repository fetched on this host with the tenant's credential, as a git bundle),
//! `repo` (the clone from that bundle, the base commit, the patch), `pty`, `ttl`
//! (expiry), `templates` (images to templates) and `connect` (Connect-RPC framing).

mod api;
mod args;
mod backend;
mod config;
pub mod connect;
mod create;
mod envd;
mod files;
mod pty;
mod repo;
mod seed;
pub mod templates;
mod ttl;

use crate::local::{base::keyed_lock::KeyedLock, core::provisioner::Provisioner};
use std::{collections::HashMap, path::PathBuf, sync::Arc};

pub use args::E2bArgs;
pub use config::{ApiKey, E2bConfig};

pub const BACKEND: &str = "e2b";
pub const ID_PREFIX: &str = "e2b-";
/// envd's port inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// Where a create uploads the repository's bundle; removed once cloned.
const BUNDLE_FILE: &str = "/home/user/.forkyard-repo.bundle";
/// The default bound of a repository's bundle (`--e2b-bundle-max-bytes`).
pub const DEFAULT_BUNDLE_MAX_BYTES: u64 = 512 << 20;
/// The default user's home; the workspace is a clone under it.
pub const HOME: &str = "/home/user";
pub const WORKSPACE: &str = "/home/user/workspace";
/// Where create records the base commit inside the sandbox.
const BASE_FILE: &str = "/home/user/.forkyard-base-commit";
/// Metadata key marking sandboxes this service created (list filters on it).
const MANAGED: &str = "forkyard.managed";
const BRANCH_KEY: &str = "forkyard.branch";
const KEY_KEY: &str = "forkyard.idempotency_key";
/// Metadata key holding our expiry (unix ms): E2B's own timeout is kept equal to it.
const EXPIRES_KEY: &str = "forkyard.expires_unix_ms";
/// The image a sandbox was created for (its template is the one mapped to it).
const IMAGE_KEY: &str = "forkyard.image";

/// What create learned that E2B does not return later.
#[derive(Clone)]
struct Known {
    envd_token: Option<String>,
    domain: Option<String>,
    base_commit: String,
}

#[derive(Clone)]
pub struct E2bBackend {
    config: E2bConfig,
    http: reqwest::Client,
    owner_endpoint: String,
    owner_task_queue: String,
    /// Open pty commands: pty id → (E2B sandbox id, envd pid).
    ptys: Arc<std::sync::Mutex<HashMap<String, (String, u64)>>>,
    known: Arc<std::sync::Mutex<HashMap<String, Known>>>,
    /// The local core: its repository checks, git credentials and workspace templates
    /// are this backend's too (`seed`), so a run's forks fetch a repository once.
    local: Arc<Provisioner>,
    /// One bundle made at a time per template (`seed`).
    bundling: Arc<KeyedLock<PathBuf>>,
}

impl E2bBackend {
    /// Sandboxes this replica owns (at the local core's endpoint and task queue).
    pub fn new(config: E2bConfig, local: Arc<Provisioner>) -> Result<Arc<Self>, String> {
        seed::sweep(&local);
        let http = reqwest::Client::builder()
            .connect_timeout(config.request_timeout)
            .build()
            .map_err(|e| format!("E2B HTTP client: {e}"))?;
        Ok(Arc::new(Self {
            config,
            http,
            owner_endpoint: local.advertise_endpoint().to_owned(),
            owner_task_queue: local.owner_task_queue().to_owned(),
            ptys: Arc::default(),
            known: Arc::default(),
            local,
            bundling: Arc::default(),
        }))
    }

    pub fn enabled(&self) -> bool {
        self.config.api_key.is_some()
    }

    fn known(&self, sid: &str) -> Option<Known> {
        self.known.lock().expect("known lock").get(sid).cloned()
    }
}

impl E2bBackend {
    /// A handle sharing this backend's client and state, for spawned tasks.
    fn self_arc(&self) -> Arc<Self> {
        Arc::new(self.clone())
    }
}
