//! Stale reservations: money HELD for a fork workflow that closed (terminated, crashed
//! past its cleanup) or that Temporal does not know. The janitor releases it, so a run's
//! budget is never blocked by a fork that is gone.

use crate::{classify::WorkflowState, error::JanitorError, workflows::Workflows};
use forkyard_common::grpc_telemetry::{TracedChannel, traced_channel};
use forkyard_proto::{
    budget::v1::{
        ListReservationsRequest, ReleaseRequest, ReservationState,
        budget_ledger_client::BudgetLedgerClient,
    },
    janitor::v1::ReservationAction,
};

/// Releases stale reservations through the ledger's gRPC API.
#[derive(Clone)]
pub struct Ledger {
    client: BudgetLedgerClient<TracedChannel>,
}

impl Ledger {
    pub fn connect_lazy(addr: &str) -> Result<Self, JanitorError> {
        let channel = forkyard_common::discovery::balanced("ledger_addr", addr, |ep| {
            ep.timeout(forkyard_common::tls::SHORT_CALL_DEADLINE)
        })
        .map_err(|reason| JanitorError::InvalidArgument {
            field: "ledger_addr",
            reason,
        })?;
        Ok(Self {
            client: BudgetLedgerClient::new(traced_channel(channel)),
        })
    }

    /// Every HELD reservation whose holder workflow is closed or unknown; released unless
    /// `dry_run`. A holder that is running, or whose state cannot be read, is left alone.
    pub async fn sweep(
        &self,
        workflows: &impl Workflows,
        dry_run: bool,
    ) -> Result<Vec<ReservationAction>, JanitorError> {
        let mut client = self.client.clone();
        let held = client
            .list_reservations(ListReservationsRequest {
                account_id: String::new(),
                state: ReservationState::Held as i32,
            })
            .await
            .map_err(|s| JanitorError::Ledger(s.message().to_owned()))?
            .into_inner()
            .reservations;
        let mut actions = Vec::new();
        for r in held {
            let holder = r.holder.trim();
            if holder.is_empty() {
                continue;
            }
            let reason = match workflows.state(holder).await {
                Ok(WorkflowState::Closed(status)) => format!("holder workflow closed: {status}"),
                Ok(WorkflowState::NotFound) => "holder workflow not found".to_owned(),
                // A running holder (even a silent one) still settles its own reservation.
                Ok(WorkflowState::Running | WorkflowState::Silent(_) | WorkflowState::Unknown) => {
                    continue;
                }
                Err(e) => {
                    tracing::warn!(reservation_id = %r.reservation_id, holder, error = %e, "cannot check holder, reservation kept");
                    continue;
                }
            };
            let mut action = ReservationAction {
                reservation_id: r.reservation_id.clone(),
                account_id: r.account_id.clone(),
                holder: holder.to_owned(),
                amount_micros: r.amount_micros,
                reason: reason.clone(),
                released: false,
                error: String::new(),
            };
            if dry_run {
                tracing::info!(reservation_id = %r.reservation_id, %reason, "stale reservation (dry run, kept)");
            } else {
                let release = ReleaseRequest {
                    reservation_id: r.reservation_id.clone(),
                    // Stable per reservation: a retried sweep replays, never double-releases.
                    idempotency_key: format!("janitor/release/{}", r.reservation_id),
                };
                match client.release(release).await {
                    Ok(_) => {
                        tracing::info!(reservation_id = %r.reservation_id, account_id = %r.account_id, %reason, "stale reservation released");
                        action.released = true;
                    }
                    Err(s) => {
                        tracing::warn!(reservation_id = %r.reservation_id, error = %s.message(), "stale reservation release failed");
                        action.error = s.message().to_owned();
                    }
                }
            }
            actions.push(action);
        }
        Ok(actions)
    }
}
