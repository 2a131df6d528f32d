//! The router: [`Backends`] owns every backend this replica serves and sends each
//! request to one: `CreateSandboxRequest.backend` on create, the id's prefix (`sbx-`
//! local, `e2b-` E2B, …) afterwards. Callers (gRPC, activities) only see [`Backends`].

use crate::{
    backend::SandboxBackend,
    e2b::{self, E2bBackend, E2bConfig},
    error::{ProvisionerError, Result},
    local::{api::backend::LocalBackend, core::provisioner::Provisioner},
    patch_records::PatchRecords,
};
use forkyard_proto::sandbox::v1::{
    BackendOffer, CollectPatchRequest, CollectPatchResponse, CreateSandboxRequest, Sandbox,
};
use std::{collections::HashMap, sync::Arc};
use tracing::info;

/// Every backend this replica serves; `local` is the default and the fallback for ids
/// no other backend claims.
#[derive(Clone)]
pub struct Backends {
    local: Arc<Provisioner>,
    all: Vec<Arc<dyn SandboxBackend>>,
    /// Patches collected under an idempotency key, whatever the backend.
    records: Arc<PatchRecords>,
}

impl Backends {
    /// `local`, and `e2b` with these settings (disabled without an API key). Both hand
    /// out sandboxes this replica owns: at the local core's endpoint and task queue.
    pub fn open(local: Arc<Provisioner>, e2b: E2bConfig) -> Result<Self, String> {
        let e2b = E2bBackend::new(e2b, local.clone())?;
        if !e2b.enabled() {
            info!("e2b backend disabled (no E2B_API_KEY)");
        }
        let all: Vec<Arc<dyn SandboxBackend>> = vec![Arc::new(LocalBackend(local.clone())), e2b];
        let dir = local.config.state_dir.join("patch-records");
        let records = PatchRecords::open(&dir)
            .map(Arc::new)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self {
            local,
            all,
            records,
        })
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

    /// The names of the backends that can create sandboxes here, `local` first.
    pub fn offered(&self) -> Vec<String> {
        self.all
            .iter()
            .filter(|b| b.enabled())
            .map(|b| b.name().to_owned())
            .collect()
    }

    /// What each backend that can create sandboxes here offers, `local` first.
    pub async fn offers(&self) -> Vec<BackendOffer> {
        let mut offers = Vec::new();
        for b in self.all.iter().filter(|b| b.enabled()) {
            let (isolations, unavailable) = b.isolations().await;
            offers.push(BackendOffer {
                name: b.name().to_owned(),
                isolations,
                unavailable,
            });
        }
        offers
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

    /// The sandbox's patch, from the backend that holds it; under an idempotency key,
    /// the first answer again (`crate::patch_records`), also once the sandbox is gone.
    pub async fn collect_patch(&self, req: CollectPatchRequest) -> Result<CollectPatchResponse> {
        let key = req.idempotency_key.clone();
        if key.is_empty() {
            return self.for_id(&req.sandbox_id).collect_patch(req).await;
        }
        if key.len() > 512 {
            return Err(ProvisionerError::invalid(
                "idempotency_key",
                "is over 512 bytes",
            ));
        }
        let (records, id) = (self.records.clone(), req.sandbox_id.clone());
        let recorded = tokio::task::spawn_blocking(move || records.get(&key, &id))
            .await
            .map_err(|e| ProvisionerError::internal("read a patch record", e))?
            .map_err(|why| ProvisionerError::invalid("idempotency_key", why))?;
        if let Some(answer) = recorded {
            return Ok(answer);
        }
        let (key, id) = (req.idempotency_key.clone(), req.sandbox_id.clone());
        let answer = self.for_id(&req.sandbox_id).collect_patch(req).await?;
        let (records, kept) = (self.records.clone(), answer.clone());
        tokio::task::spawn_blocking(move || records.put(&key, &id, &kept))
            .await
            .map_err(|e| ProvisionerError::internal("record a patch", e))?
            .map_err(|e| ProvisionerError::internal("record a patch", e))?;
        Ok(answer)
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
