//! A new E2B sandbox: the request checked, the repository fetched on this host (`seed`),
//! a sandbox started from the image's template with our metadata and the network rules
//! of its egress allowlist (`forkyard_common::e2b_egress`), the repository cloned into
//! it from the bundle, and E2B's timeout set to our TTL.

use super::{
    BACKEND, BRANCH_KEY, E2bBackend, EXPIRES_KEY, ID_PREFIX, IMAGE_KEY, KEY_KEY, Known, MANAGED,
    api::ApiSandbox, seed::Seed,
};
use crate::{
    error::{ProvisionerError, Result},
    git,
    limits::now_ms,
};
use forkyard_common::e2b_egress;
use forkyard_proto::sandbox::v1::{CreateSandboxRequest, Sandbox};
use reqwest::Method;
use serde_json::json;
use std::collections::HashMap;
use tracing::{info, warn};

impl E2bBackend {
    pub(super) async fn create_sandbox(&self, mut req: CreateSandboxRequest) -> Result<Sandbox> {
        self.key()?;
        let template = self.template_for(&req)?;
        let network = self.network(&req)?;
        git::check_branch(&req.branch).await?;
        if let Some(s) = self.created_with_key(&req.idempotency_key).await? {
            info!(sandbox_id = %s.id, "create repeated with the same idempotency key");
            return Ok(s);
        }
        // Before the sandbox: a repository that cannot be read costs no sandbox, and
        // the sandbox's paid time does not include the fetch.
        let seed = self.seed(&mut req).await?;
        let timeout = match req.ttl_secs {
            0 => self.config.default_timeout.as_secs(),
            s => u64::from(s),
        };
        let expires = now_ms()
            .saturating_add(i64::try_from(timeout.saturating_mul(1000)).unwrap_or(i64::MAX));
        let metadata = metadata(&req, expires);
        let api = self
            .start_sandbox(&template, timeout, &metadata, network)
            .await?;
        let sid = api.sandbox_id.clone();
        info!(sandbox_id = %format!("{ID_PREFIX}{sid}"), template = %template, "e2b sandbox created");
        let base = self.clone_or_kill(&sid, &req, &seed).await?;
        // E2B's clock started at its create; the clone took a while. Set its timeout
        // again so that E2B ends the sandbox when ours says, not later.
        if let Err(e) = self.set_timeout(&sid, expires).await {
            warn!(sandbox_id = %sid, error = %e, "cannot align the e2b timeout with the ttl");
        }
        let now = now_ms();
        let mut s = self.to_proto(&ApiSandbox {
            metadata: Some(metadata),
            ..api
        });
        s.base_commit = base;
        s.created_unix_ms = now;
        Ok(s)
    }

    /// E2B's network rules for `req`'s egress allowlist: all traffic denied but the
    /// listed hosts and the metering LLM gateway, with an allowlist or without one (as a
    /// local sandbox). An entry E2B cannot express is refused naming the field.
    fn network(&self, req: &CreateSandboxRequest) -> Result<Option<serde_json::Value>> {
        let network = e2b_egress::network(&req.egress_allow, &self.config.allow_out)
            .map_err(|e| ProvisionerError::invalid("egress_allow", e))?;
        if !req.egress_allow.is_empty() && self.config.allow_out.is_empty() {
            warn!(
                "an egress allowlist on e2b with no --public-llm-gateway-url: the sandbox reaches no LLM gateway"
            );
        }
        Ok(Some(network))
    }

    /// The template `req` runs on, once the request is one this backend can serve.
    fn template_for(&self, req: &CreateSandboxRequest) -> Result<String> {
        if !req.snapshot_id.is_empty() {
            return Err(ProvisionerError::invalid(
                "snapshot_id",
                "not supported by the e2b backend",
            ));
        }
        // An image runs as the template the operator built from it; one not mapped is
        // refused rather than run on the default template without the tools asked for.
        let template = self.config.templates.for_image(&req.image)?;
        let template = template.unwrap_or(&self.config.template).to_owned();
        if req.repo.trim().is_empty() {
            return Err(ProvisionerError::invalid("repo", "must not be empty"));
        }
        Ok(template)
    }

    /// The sandbox an earlier create with idempotency key `key` made, if any.
    async fn created_with_key(&self, key: &str) -> Result<Option<Sandbox>> {
        if key.is_empty() {
            return Ok(None);
        }
        let mut sel = HashMap::new();
        sel.insert(KEY_KEY.to_owned(), key.to_owned());
        Ok(self.list_api(&sel).await?.into_iter().next())
    }

    /// E2B's create (counted in the sandbox metrics); what it returns is remembered, for
    /// E2B does not give the envd token and domain again.
    async fn start_sandbox(
        &self,
        template: &str,
        timeout: u64,
        metadata: &HashMap<String, String>,
        network: Option<serde_json::Value>,
    ) -> Result<ApiSandbox> {
        let mut body = json!({
            "templateID": template,
            "timeout": timeout,
            "metadata": metadata,
        });
        if let Some(n) = network {
            body["network"] = n;
        }
        let created = self
            .api(
                Method::POST,
                "/sandboxes",
                &[],
                Some(body),
                "create sandbox",
                "",
            )
            .await;
        crate::metrics::created(BACKEND, &created);
        let created = created?
            .ok_or_else(|| ProvisionerError::Unavailable("E2B create: empty response".into()))?;
        let api: ApiSandbox = serde_json::from_value(created)
            .map_err(|e| ProvisionerError::Unavailable(format!("E2B create: {e}")))?;
        self.known.lock().expect("known lock").insert(
            api.sandbox_id.clone(),
            Known {
                envd_token: api.envd_access_token.clone(),
                domain: api.domain.clone(),
                base_commit: String::new(),
            },
        );
        Ok(api)
    }

    /// The repository cloned into sandbox `sid`; its base commit. A sandbox whose clone
    /// failed is killed: nobody holds its id.
    async fn clone_or_kill(
        &self,
        sid: &str,
        req: &CreateSandboxRequest,
        seed: &Seed,
    ) -> Result<String> {
        let base = match self.clone_repo(sid, req, seed).await {
            Ok(b) => b,
            Err(e) => {
                warn!(sandbox_id = %sid, error = %e, "e2b create failed; killing the sandbox");
                let _ = self.kill(sid).await;
                self.known.lock().expect("known lock").remove(sid);
                return Err(e);
            }
        };
        if let Some(k) = self.known.lock().expect("known lock").get_mut(sid) {
            k.base_commit.clone_from(&base);
        }
        Ok(base)
    }
}

/// The sandbox's E2B metadata: its labels, and ours (list finds our sandboxes, a repeated
/// create its first one, and get the branch, image and expiry by them).
fn metadata(req: &CreateSandboxRequest, expires: i64) -> HashMap<String, String> {
    let mut metadata = req.labels.clone();
    metadata.insert(MANAGED.into(), "true".into());
    metadata.insert(BRANCH_KEY.into(), req.branch.clone());
    if !req.idempotency_key.is_empty() {
        metadata.insert(KEY_KEY.into(), req.idempotency_key.clone());
    }
    if !req.image.is_empty() {
        metadata.insert(IMAGE_KEY.into(), req.image.clone());
    }
    metadata.insert(EXPIRES_KEY.into(), expires.to_string());
    metadata
}
