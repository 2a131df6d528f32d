//! Lifecycle without callers: taking over sandboxes after a restart (or destroying what
//! cannot be accounted for), and destroying sandboxes whose TTL has passed.

use crate::{
    limits::now_ms,
    local::{
        base::fs::remove_all,
        core::{entry::Entry, provisioner::Provisioner},
        isolation::uids,
        storage::store::Record,
    },
};
use forkyard_proto::sandbox::v1::DestroySandboxRequest;
use std::sync::{Arc, Weak};
use tracing::{info, warn};

impl Provisioner {
    /// At start-up: adopt every complete, unexpired record (fresh cgroups and egress
    /// proxy, any process left from the previous run killed); finish interrupted destroys,
    /// destroy expired sandboxes, and kill and remove cgroups no record accounts for.
    pub(crate) async fn reconcile(&self, records: Vec<Record>) {
        let now = now_ms();
        for mut record in records {
            let id = record.id.clone();
            // Whoever adopts a sandbox owns it now (the replica may listen elsewhere or
            // carry a new id after the restart).
            record
                .owner_endpoint
                .clone_from(&self.config.advertise_endpoint);
            record
                .owner_task_queue
                .clone_from(&self.config.owner_task_queue);
            let expired = record.expires_unix_ms != 0 && record.expires_unix_ms <= now;
            if record.destroying || expired {
                info!(sandbox_id = %id, expired, "destroying a sandbox left by the previous run");
                self.remove_leftover(&id);
                continue;
            }
            self.adopt(record);
        }
        self.remove_unknown_cgroups();
    }

    /// A sandbox the previous run left, live: anything it left running killed, its uid
    /// and overlay restored, its running side made; destroyed where any of that fails.
    fn adopt(&self, mut record: Record) {
        let id = record.id.clone();
        if let Some(cg) = &self.isolation.cgroups {
            cg.kill_all(&id);
        }
        if let Err(e) = self.adopt_uid(&mut record) {
            warn!(sandbox_id = %id, error = %e, "cannot give the sandbox a uid of its own; destroying it");
            self.remove_leftover(&id);
            return;
        }
        // An overlay's mount went with the last run: mounted again, as its uid's.
        if let Some(lower) = &record.overlay
            && let Err(e) = self.storage.store.overlays().mount(
                &id,
                lower,
                &self.storage.store.dir(&id),
                record.uid,
            )
        {
            tracing::error!(sandbox_id = %id, error = %e, "cannot mount the sandbox's overlay workspace; destroying it");
            self.remove_leftover(&id);
            self.release_uid(record.uid);
            return;
        }
        let entry = Entry::new(record);
        match self.activate(&entry) {
            Ok(()) => {
                info!(sandbox_id = %id, "sandbox adopted after restart");
                self.sandboxes
                    .lock()
                    .expect("sandboxes lock")
                    .insert(id, entry);
            }
            Err(e) => {
                warn!(sandbox_id = %id, error = %e, "cannot restore sandbox; destroying it");
                entry.cancel.cancel();
                self.remove_leftover(&id);
            }
        }
    }

    /// The cgroups no adopted sandbox accounts for, killed and removed.
    fn remove_unknown_cgroups(&self) {
        if let Some(cg) = &self.isolation.cgroups {
            let known = self.sandboxes.lock().expect("sandboxes lock").clone();
            for id in cg.list() {
                if !known.contains_key(&id) {
                    warn!(cgroup = %id, "killing and removing a cgroup no sandbox accounts for");
                    cg.remove(&id);
                }
            }
        }
    }

    /// Keep an adopted sandbox's uid, or give it one (made before uids were handed out,
    /// or its uid is another's now): its workspace follows.
    fn adopt_uid(&self, record: &mut Record) -> crate::error::Result<()> {
        let Some(uids) = &self.isolation.uids else {
            return Ok(());
        };
        uids::let_through(&self.storage.store.dir(&record.id)).map_err(|e| {
            crate::error::ProvisionerError::internal("open the sandbox's directory", e)
        })?;
        if record.uid != 0 && uids.hold(record.uid) {
            return Ok(());
        }
        let uid = uids.claim()?;
        let given = uids::give_workspace(&self.storage.store.own_files(record), uid).map_err(|e| {
            crate::error::ProvisionerError::internal("give the workspace to its uid", e)
        });
        if let Err(e) = given {
            uids.release(uid);
            return Err(e);
        }
        record.uid = uid;
        self.storage.store.save(record)
    }

    fn remove_leftover(&self, id: &str) {
        self.storage.store.overlays().remove(id);
        if let Some(cg) = &self.isolation.cgroups {
            cg.remove(id);
        }
        if let Err(e) = remove_all(&self.storage.store.dir(id)) {
            warn!(sandbox_id = %id, error = %e, "cannot remove sandbox directory");
        }
    }

    /// Ids of sandboxes whose TTL has passed.
    fn expired(&self) -> Vec<String> {
        let now = now_ms();
        let map = self.sandboxes.lock().expect("sandboxes lock");
        map.values()
            .map(|e| e.record())
            .filter(|r| !r.destroying && r.expires_unix_ms != 0 && r.expires_unix_ms <= now)
            .map(|r| r.id)
            .collect()
    }
}

/// Destroy expired sandboxes every `reap_interval`, for as long as the core lives.
pub(crate) fn spawn(core: &Arc<Provisioner>) {
    let weak: Weak<Provisioner> = Arc::downgrade(core);
    let every = core.config.reap_interval;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let Some(core) = weak.upgrade() else { return };
            for id in core.expired() {
                info!(sandbox_id = %id, "sandbox TTL passed; destroying it");
                let req = DestroySandboxRequest {
                    sandbox_id: id.clone(),
                    reason: "ttl expired".into(),
                };
                if let Err(e) = core.destroy(req).await {
                    warn!(sandbox_id = %id, error = %e, "cannot destroy expired sandbox");
                }
            }
        }
    });
}
