//! `forkyard.gateway.v1.ApiKeys`: API keys managed over the API (what `forkyard keys`
//! calls), by admin tenants only. The store is the one the gate checks every call
//! against, so a key made here works, and one revoked here is refused, on every replica
//! sharing it from its next call.

use super::tenant;
use crate::{
    auth::{
        Tenant,
        keys::{KeyError, KeyInfo, KeyStore},
    },
    error::GatewayError,
};
use forkyard_proto::gateway::v1::{
    ApiKey, CreateApiKeyRequest, CreateApiKeyResponse, ListApiKeysRequest, ListApiKeysResponse,
    RevokeApiKeyRequest, RevokeApiKeyResponse, api_keys_server::ApiKeys,
};
use tonic::{Request, Response, Status};

/// The service; `store` is `None` when the gateway runs without api keys.
#[derive(Clone, Debug)]
pub struct ApiKeysService {
    store: Option<KeyStore>,
}

impl ApiKeysService {
    pub fn new(store: Option<KeyStore>) -> Self {
        Self { store }
    }

    /// The store, for an admin tenant.
    fn store_for(&self, t: &Tenant) -> Result<&KeyStore, Status> {
        let Some(store) = &self.store else {
            return Err(GatewayError::FailedPrecondition(
                "this gateway runs without api keys (FORKYARD_AUTH=none): there are none to manage"
                    .into(),
            )
            .into());
        };
        if !t.admin {
            return Err(GatewayError::PermissionDenied(format!(
                "tenant {} may not manage api keys (not in --admin-tenants)",
                t.name
            ))
            .into());
        }
        Ok(store)
    }
}

fn api_key(k: KeyInfo) -> ApiKey {
    ApiKey {
        id: k.id,
        tenant: k.tenant,
        name: k.name,
        created_unix_ms: k.created_unix_ms,
        revoked_unix_ms: k.revoked_unix_ms,
    }
}

/// The store's errors as the API says them: bad input names its field.
fn status(e: KeyError) -> Status {
    match e {
        // Its message starts with the field: `tenant: …`, `name: …`.
        KeyError::Invalid(why) => GatewayError::InvalidArgument(why),
        KeyError::NotFound(id) => GatewayError::NotFound(format!("api key {id} not found")),
        other => {
            tracing::error!(error = %other, "api key store failed");
            GatewayError::Unavailable("the api key store cannot be reached right now".into())
        }
    }
    .into()
}

#[tonic::async_trait]
impl ApiKeys for ApiKeysService {
    async fn create_api_key(
        &self,
        req: Request<CreateApiKeyRequest>,
    ) -> Result<Response<CreateApiKeyResponse>, Status> {
        let t = tenant(&req)?;
        let store = self.store_for(&t)?;
        let r = req.into_inner();
        let made = store
            .create(r.tenant.trim(), &r.name)
            .await
            .map_err(status)?;
        tracing::info!(by = %t.name, key_id = %made.info.id, tenant = %made.info.tenant, "api key created");
        Ok(Response::new(CreateApiKeyResponse {
            key: Some(api_key(made.info)),
            secret: made.key,
        }))
    }

    async fn list_api_keys(
        &self,
        req: Request<ListApiKeysRequest>,
    ) -> Result<Response<ListApiKeysResponse>, Status> {
        let t = tenant(&req)?;
        let keys = self.store_for(&t)?.list().await.map_err(status)?;
        Ok(Response::new(ListApiKeysResponse {
            keys: keys.into_iter().map(api_key).collect(),
        }))
    }

    async fn revoke_api_key(
        &self,
        req: Request<RevokeApiKeyRequest>,
    ) -> Result<Response<RevokeApiKeyResponse>, Status> {
        let t = tenant(&req)?;
        let store = self.store_for(&t)?;
        let id = req.into_inner().id;
        if id.trim().is_empty() {
            let why = "the key's id (`forkyard keys list`) is required";
            return Err(GatewayError::field("id", why).into());
        }
        let key = store.revoke(id.trim()).await.map_err(status)?;
        tracing::info!(by = %t.name, key_id = %key.id, tenant = %key.tenant, "api key revoked");
        Ok(Response::new(RevokeApiKeyResponse {
            key: Some(api_key(key)),
        }))
    }
}
