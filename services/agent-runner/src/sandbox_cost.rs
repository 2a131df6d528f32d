//! The sandbox's own cost while its agent runs: every heartbeat the runner reads what
//! the sandbox has used so far (priced by its provisioner) and charges the growth to the
//! fork's reservation, so a budget also stops a fork that burns CPU without calling any
//! model. The fork's commit adds whatever the sandbox used after the agent (verify,
//! patch), from the figure its patch collection returns.
//!
//! Keys are `<charge_key>/sandbox-a<activity attempt>-<n>`: a retried attempt resumes
//! from the last heartbeat's `sandbox_charged_micros`, so what a failed attempt charged
//! and reported is not charged again. (A charge posted after the failed attempt's last
//! heartbeat is charged again by the retry: at most one interval's sandbox time.)

use crate::{charge::Charger, error::AgentError};
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::{
    agent::v1::AgentProgress,
    sandbox::v1::{GetSandboxRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};

pub struct SandboxCost {
    sandbox_id: String,
    charger: Option<Charger>,
    activity_attempt: u32,
    seq: u32,
}

impl SandboxCost {
    pub fn new(sandbox_id: &str, charger: Option<Charger>, activity_attempt: u32) -> Self {
        Self {
            sandbox_id: sandbox_id.to_owned(),
            charger,
            activity_attempt,
            seq: 0,
        }
    }

    /// Read the sandbox's cost and charge what grew since `progress` last counted it
    /// (`progress` then holds it). Err only when the reservation refuses: the fork's
    /// budget is spent. A provisioner or ledger that does not answer is skipped: the
    /// next beat, or the fork's commit, counts it.
    pub async fn tick(
        &mut self,
        client: &mut SandboxProvisionerClient<Channel>,
        progress: &mut AgentProgress,
    ) -> Result<(), AgentError> {
        let req = GetSandboxRequest {
            sandbox_id: self.sandbox_id.clone(),
        };
        let cost = match client.get_sandbox(req).await {
            Ok(s) => s.into_inner().usage.map_or(0, |u| u.cost_micros),
            Err(s) => {
                tracing::debug!(sandbox_id = %self.sandbox_id, error = %s.message(), "sandbox usage not read");
                return Ok(());
            }
        };
        let grown = cost - progress.sandbox_charged_micros;
        if grown <= 0 {
            return Ok(());
        }
        if let Some(charger) = &mut self.charger {
            self.seq += 1;
            let name = format!("sandbox-a{}-{}", self.activity_attempt, self.seq);
            match charger.charge_as(&name, self.seq, grown).await {
                Ok(_) => progress.charged_micros += grown,
                Err(e @ AgentError::BudgetExceeded(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(sandbox_id = %self.sandbox_id, error = %e, "sandbox cost charge failed");
                    return Ok(());
                }
            }
        }
        progress.sandbox_charged_micros += grown;
        progress.cost_micros += grown;
        Ok(())
    }
}
