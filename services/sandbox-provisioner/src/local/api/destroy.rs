//! Destroying a sandbox on the `local` backend: its commands and init killed, its cgroup
//! emptied, its directory removed, its uid handed back.

use crate::{
    error::{ProvisionerError, Result},
    local::core::provisioner::Provisioner,
};
use forkyard_proto::sandbox::v1::{DestroySandboxRequest, DestroySandboxResponse};
use std::{sync::Arc, time::Duration};
use tracing::{info, warn};

/// How long destroy waits for killed commands to go before removing the workspace anyway.
const DESTROY_WAIT: Duration = Duration::from_secs(30);

impl Provisioner {
    /// Kill every command running in the sandbox, wait for them and remove it.
    /// Destroy a sandbox. The work runs on a task of its own, to the end: a caller that
    /// hangs up midway (a gateway killed during a fork's finish) never leaves a sandbox
    /// marked destroying, listed and on disk.
    pub async fn destroy(
        self: &Arc<Self>,
        req: DestroySandboxRequest,
    ) -> Result<DestroySandboxResponse> {
        let core = self.clone();
        tokio::spawn(async move { core.destroy_to_the_end(req).await })
            .await
            .map_err(|e| ProvisionerError::internal("destroy sandbox", e))?
    }

    async fn destroy_to_the_end(
        &self,
        req: DestroySandboxRequest,
    ) -> Result<DestroySandboxResponse> {
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
        if let Err(e) = self.storage.store.save(&record) {
            warn!(sandbox_id = %id, error = %e, "cannot mark sandbox as destroying on disk");
        }
        entry.cancel.cancel();
        entry.end_init();
        // The cgroup holds every process the sandbox ever started, also ones that left
        // the exec's process tree.
        if let Some(cg) = self.isolation.cgroups.clone() {
            let id = id.clone();
            let _ = tokio::task::spawn_blocking(move || cg.kill_all(&id)).await;
        }
        let mut execs = entry.execs.subscribe();
        if tokio::time::timeout(DESTROY_WAIT, execs.wait_for(|s| s.running == 0))
            .await
            .is_err()
        {
            warn!(sandbox_id = %id, "commands still running after kill, removing the workspace anyway");
        }
        let store = self.storage.store.clone();
        let sid = id.clone();
        tokio::task::spawn_blocking(move || store.remove_later(&sid))
            .await
            .map_err(|e| ProvisionerError::internal("remove sandbox", e))?
            .map_err(|e| ProvisionerError::internal("remove sandbox", e))?;
        if let Some(cg) = self.isolation.cgroups.clone() {
            let id = id.clone();
            let _ = tokio::task::spawn_blocking(move || cg.remove(&id)).await;
        }
        self.sandboxes.lock().expect("sandboxes lock").remove(id);
        self.release_uid(record.uid);
        crate::metrics::destroyed(record.created_unix_ms);
        info!(sandbox_id = %id, reason = %req.reason, "sandbox destroyed");
        Ok(DestroySandboxResponse { existed: true })
    }
}
