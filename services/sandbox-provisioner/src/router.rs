//! The router: [`Backends`] owns every backend this replica serves and sends each
//! request to one: `CreateSandboxRequest.backend` on create, the id's prefix (`sbx-`
//! local, `e2b-` E2B, …) afterwards. Callers (gRPC, activities) only see [`Backends`].

use crate::{
    backend::SandboxBackend,
    e2b::{self, E2bBackend, E2bConfig},
    error::{ProvisionerError, Result},
    local::{backend::LocalBackend, provisioner::Provisioner},
};
use forkyard_proto::sandbox::v1::{CreateSandboxRequest, Sandbox};
use std::{collections::HashMap, sync::Arc};
use tracing::info;

/// Every backend this replica serves; `local` is the default and the fallback for ids
/// no other backend claims.
#[derive(Clone)]
pub struct Backends {
    local: Arc<Provisioner>,
    all: Vec<Arc<dyn SandboxBackend>>,
}

impl Backends {
    /// `local`, and `e2b` with these settings (disabled without an API key). Both hand
    /// out sandboxes this replica owns: at the local core's endpoint and task queue.
    pub fn open(local: Arc<Provisioner>, e2b: E2bConfig) -> Result<Self, String> {
        let e2b = E2bBackend::new(
            e2b,
            local.advertise_endpoint().to_owned(),
            local.owner_task_queue().to_owned(),
        )?;
        if !e2b.enabled() {
            info!("e2b backend disabled (no E2B_API_KEY)");
        }
        let all: Vec<Arc<dyn SandboxBackend>> = vec![Arc::new(LocalBackend(local.clone())), e2b];
        Ok(Self { local, all })
    }

    /// `local`, and `e2b` disabled (no API key): what a caller that serves local
    /// sandboxes alone builds.
    pub fn new(local: Arc<Provisioner>) -> Self {
        // Only the HTTP client can fail, and only where TLS cannot start at all.
        Self::open(local, E2bConfig::default()).expect("an e2b backend without a key")
    }

    /// One more backend (e.g. Kubernetes); it must not reuse a name or id prefix.
    #[must_use]
    pub fn with(mut self, backend: Arc<dyn SandboxBackend>) -> Self {
        self.all.retain(|b| b.name() != backend.name());
        self.all.push(backend);
        self
    }

    pub fn local(&self) -> &Arc<Provisioner> {
        &self.local
    }

    /// The backend `e2b.*` activities serve (E2B unless [`Self::with`] replaced it).
    pub fn e2b(&self) -> &Arc<dyn SandboxBackend> {
        self.by_name(e2b::BACKEND)
            .expect("every router serves a backend named e2b")
    }

    /// The backend named `name` ("" = local).
    pub fn by_name(&self, name: &str) -> Result<&Arc<dyn SandboxBackend>> {
        let name = if name.is_empty() { "local" } else { name };
        self.all.iter().find(|b| b.name() == name).ok_or_else(|| {
            let known: Vec<&str> = self.all.iter().map(|b| b.name()).collect();
            ProvisionerError::invalid(
                "backend",
                format!("{name:?} is not served here (one of {known:?})"),
            )
        })
    }

    /// The backend that handed out `id`.
    pub fn for_id(&self, id: &str) -> &Arc<dyn SandboxBackend> {
        self.all
            .iter()
            .skip(1)
            .find(|b| id.starts_with(b.id_prefix()))
            .unwrap_or(&self.all[0])
    }

    pub async fn create(&self, req: CreateSandboxRequest) -> Result<Sandbox> {
        self.by_name(&req.backend)?.create(req).await
    }

    /// Sandboxes of every backend; a backend that is disabled contributes none.
    pub async fn list(&self, selector: &HashMap<String, String>) -> Result<Vec<Sandbox>> {
        let mut out = Vec::new();
        for b in &self.all {
            out.extend(b.list(selector).await?);
        }
        Ok(out)
    }
}
