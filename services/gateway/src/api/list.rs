//! ListRuns: the caller's runs from Temporal's visibility, a page at a time.

use super::{GatewayService, run_state::run_state};
use crate::{auth::Tenant, error::GatewayError, search};
use forkyard_common::clock::unix_ms;
use forkyard_proto::gateway::v1::{ListRunsRequest, ListRunsResponse, RunState, RunSummary};
use futures::StreamExt;
use temporalio_client::{WorkflowExecution, WorkflowListOptions};

/// Most runs one ListRuns page may skip; deeper paging needs a narrower filter.
const MAX_LIST_OFFSET: usize = 100_000;

/// Where a page starts and how many runs it holds.
struct Page {
    offset: usize,
    size: usize,
}

impl GatewayService {
    pub(super) async fn list(
        &self,
        tenant: &Tenant,
        req: ListRunsRequest,
    ) -> Result<ListRunsResponse, GatewayError> {
        let page = page(&req)?;
        let state = RunState::try_from(req.state)
            .map_err(|_| GatewayError::field("state", "unknown run state"))?;
        let query = search::list_query_for(listed_tenant(tenant, &req)?, state, &req.labels)?;
        let mut stream = self
            .client
            .list_workflows(
                query,
                WorkflowListOptions::builder()
                    .limit(page.offset + page.size + 1)
                    .build(),
            )
            .skip(page.offset);
        let mut runs = Vec::new();
        let mut more = false;
        while let Some(item) = stream.next().await {
            let wf = item.map_err(|e| GatewayError::Temporal(e.to_string()))?;
            if runs.len() == page.size {
                more = true;
                break;
            }
            runs.push(summary(&wf));
        }
        let next_page_token = if more {
            (page.offset + page.size).to_string()
        } else {
            String::new()
        };
        Ok(ListRunsResponse {
            runs,
            next_page_token,
        })
    }
}

/// Whose runs a ListRuns lists: the caller's own; an admin's, every tenant's or the one
/// it names; without authentication, every run (all are the default tenant's).
fn listed_tenant<'a>(
    tenant: &'a Tenant,
    req: &'a ListRunsRequest,
) -> Result<Option<&'a str>, GatewayError> {
    let named = req.tenant.as_str();
    if !named.is_empty() {
        forkyard_keys::check_tenant(named)
            .map_err(|e| GatewayError::InvalidArgument(e.to_string()))?;
    }
    if !tenant.authenticated {
        return Ok(None);
    }
    match (tenant.admin, named) {
        (true, "") => Ok(None),
        (true, other) => Ok(Some(other)),
        (false, "") => Ok(Some(&tenant.name)),
        (false, own) if own == tenant.name => Ok(Some(own)),
        (false, other) => Err(GatewayError::PermissionDenied(format!(
            "tenant: {} lists its own runs only, not tenant {other}'s (not in --admin-tenants)",
            tenant.name
        ))),
    }
}

/// The page the request asks for: its size (50 unless given), from its token's offset.
fn page(req: &ListRunsRequest) -> Result<Page, GatewayError> {
    let size = match req.page_size {
        0 => 50,
        n if n > 1000 => return Err(GatewayError::field("page_size", "at most 1000")),
        n => n as usize,
    };
    let offset: usize = if req.page_token.is_empty() {
        0
    } else {
        req.page_token
            .parse()
            .ok()
            .filter(|o| *o <= MAX_LIST_OFFSET)
            .ok_or_else(|| GatewayError::field("page_token", "is not a token from ListRuns"))?
    };
    Ok(Page { offset, size })
}

/// One listed run: Temporal's state, or while it runs the state the run published.
fn summary(wf: &WorkflowExecution) -> RunSummary {
    let mut state = run_state(wf.status());
    let published = wf
        .search_attributes()
        .get(&crate::workflows::RUN_STATE_ATTR)
        .and_then(|s| RunState::from_str_name(&s));
    match (state, published) {
        (RunState::Running, Some(live)) => state = live,
        // A completed run in which no fork succeeded.
        (RunState::Completed, Some(RunState::Failed)) => state = RunState::Failed,
        _ => {}
    }
    RunSummary {
        run_id: wf.id().to_owned(),
        state: state as i32,
        started_unix_ms: unix_ms(wf.start_time()),
        finished_unix_ms: unix_ms(wf.close_time()),
        // Runs from before tenancy carry no tenant: they are the default tenant's.
        tenant: wf
            .search_attributes()
            .get(&search::TENANT_ATTR)
            .unwrap_or_else(|| crate::auth::DEFAULT_TENANT.to_owned()),
    }
}
