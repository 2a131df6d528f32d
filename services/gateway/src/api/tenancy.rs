//! What a tenant may launch: its concurrent-forks limit (summed over its live runs'
//! `max_concurrent` through visibility) and its spending limit, a TENANT account in the
//! ledger that its runs' accounts draw on.

use super::GatewayService;
use crate::{auth::Tenant, error::GatewayError, search, workflows::ORCHESTRATION_WORKFLOW};
use forkyard_proto::budget::v1::{AccountKind, CreateAccountRequest, GetAccountRequest};
use futures::StreamExt;
use temporalio_client::WorkflowListOptions;
use tonic::Code;

/// Most live runs of one tenant looked at when counting its fork slots.
const MAX_COUNTED_RUNS: usize = 10_000;

fn ledger_error(s: &tonic::Status) -> GatewayError {
    GatewayError::Temporal(format!("budget ledger: {}", s.message()))
}

impl GatewayService {
    /// Refuse a run whose `slots` would take the tenant over its concurrent-forks limit.
    pub(super) async fn check_fork_slots(
        &self,
        tenant: &Tenant,
        slots: u32,
    ) -> Result<(), GatewayError> {
        if !tenant.authenticated {
            return Ok(());
        }
        let limit = self.tenancy.max_concurrent_forks;
        if slots > limit {
            return Err(GatewayError::ResourceExhausted(format!(
                "max_concurrent: {slots} forks at once is above tenant {}'s limit of {limit}",
                tenant.name
            )));
        }
        let query = format!(
            "WorkflowType = '{ORCHESTRATION_WORKFLOW}' AND ExecutionStatus = 'Running' AND {} = '{}'",
            search::TENANT_ATTR.name(),
            tenant.name
        );
        let mut runs = self.client.list_workflows(
            query,
            WorkflowListOptions::builder()
                .limit(MAX_COUNTED_RUNS)
                .build(),
        );
        let mut in_flight: u64 = 0;
        while let Some(item) = runs.next().await {
            let wf = item.map_err(|e| GatewayError::Temporal(e.to_string()))?;
            let n = wf
                .search_attributes()
                .get(&search::FORK_SLOTS_ATTR)
                .unwrap_or(0);
            in_flight += u64::try_from(n).unwrap_or(0);
        }
        if in_flight + u64::from(slots) > u64::from(limit) {
            return Err(GatewayError::ResourceExhausted(format!(
                "max_concurrent: tenant {} has {in_flight} forks in flight in its live runs; \
                 {slots} more would pass its limit of {limit}",
                tenant.name
            )));
        }
        Ok(())
    }

    /// The tenant's ledger account (created with the default limit on first use); refuses
    /// the launch when its limit is spent. `None` without authentication.
    pub(super) async fn tenant_account(
        &self,
        tenant: &Tenant,
    ) -> Result<Option<String>, GatewayError> {
        let (Some(account_id), Some(ledger)) = (tenant.account_id(), &self.tenancy.ledger) else {
            return Ok(None);
        };
        let mut ledger = ledger.clone();
        let get = GetAccountRequest {
            account_id: account_id.clone(),
        };
        let account = match ledger.get_account(get.clone()).await {
            Ok(a) => a.into_inner(),
            Err(s) if s.code() == Code::NotFound => {
                let create = CreateAccountRequest {
                    account_id: account_id.clone(),
                    kind: AccountKind::Tenant as i32,
                    budget_micros: self.tenancy.default_budget_micros,
                    idempotency_key: format!("{account_id}/create"),
                    labels: [("tenant".to_owned(), tenant.name.clone())].into(),
                    ..Default::default()
                };
                match ledger.create_account(create).await {
                    Ok(a) => {
                        tracing::info!(
                            tenant = tenant.name,
                            budget_micros = self.tenancy.default_budget_micros,
                            "tenant account opened"
                        );
                        a.into_inner()
                    }
                    // Another launch made it first.
                    Err(s) if s.code() == Code::AlreadyExists => ledger
                        .get_account(get)
                        .await
                        .map_err(|s| ledger_error(&s))?
                        .into_inner(),
                    Err(s) => return Err(ledger_error(&s)),
                }
            }
            Err(s) => return Err(ledger_error(&s)),
        };
        if account.available_micros <= 0 {
            return Err(GatewayError::ResourceExhausted(format!(
                "budget_usd: tenant {} has spent its limit ({} of {} micro-USD); ask an operator to raise it",
                tenant.name,
                account.spent_micros + account.reserved_micros,
                account.budget_micros
            )));
        }
        Ok(Some(account_id))
    }
}
