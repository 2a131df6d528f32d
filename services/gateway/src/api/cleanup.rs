//! StartCleanup / StopCleanup: the janitor's Temporal Schedule. Each tick runs
//! `ScheduledCleanupWorkflow`, whose sweep activity runs on the janitor's queue.

use super::GatewayService;
use crate::{error::GatewayError, workflows::cleanup::ScheduledCleanupWorkflow};
use forkyard_proto::{
    gateway::v1::{StartCleanupRequest, StartCleanupResponse},
    janitor::v1::SweepRequest,
    queues,
};
use std::time::Duration;
use temporalio_client::schedules::{
    CreateScheduleOptions, DeleteScheduleOptions, ScheduleAction, ScheduleError,
    ScheduleOverlapPolicy, ScheduleSpec,
};

pub const SCHEDULE_ID: &str = "forkyard-cleanup";
const MAX_INTERVAL_MINUTES: u32 = 24 * 60;
const MAX_AGE_MINUTES: u32 = 7 * 24 * 60;

fn action(max_age_minutes: u32) -> ScheduleAction {
    let sweep = SweepRequest {
        dry_run: false,
        min_age_secs: 60,
        max_age_secs: max_age_minutes * 60,
        ..Default::default()
    };
    ScheduleAction::start_workflow(
        ScheduledCleanupWorkflow::run,
        sweep,
        queues::ORCHESTRATION,
        SCHEDULE_ID,
    )
}

fn schedule_error(e: ScheduleError) -> GatewayError {
    match e {
        ScheduleError::Rpc(s) if s.code() == tonic::Code::NotFound => {
            GatewayError::NotFound("no cleanup is scheduled (StartCleanup creates it)".into())
        }
        other => GatewayError::Temporal(other.to_string()),
    }
}

impl GatewayService {
    pub(super) async fn schedule_cleanup(
        &self,
        req: StartCleanupRequest,
    ) -> Result<StartCleanupResponse, GatewayError> {
        if req.interval_minutes == 0 || req.interval_minutes > MAX_INTERVAL_MINUTES {
            return Err(GatewayError::field(
                "interval_minutes",
                format!("must be 1..{MAX_INTERVAL_MINUTES}"),
            ));
        }
        if req.max_age_minutes == 0 || req.max_age_minutes > MAX_AGE_MINUTES {
            return Err(GatewayError::field(
                "max_age_minutes",
                format!("must be 1..{MAX_AGE_MINUTES}"),
            ));
        }
        let spec =
            ScheduleSpec::from_interval(Duration::from_secs(u64::from(req.interval_minutes) * 60));
        let opts = CreateScheduleOptions::builder()
            .action(action(req.max_age_minutes))
            .spec(spec.clone())
            .overlap_policy(ScheduleOverlapPolicy::Skip)
            .build();
        match self.client.create_schedule(SCHEDULE_ID, opts).await {
            Ok(_) => Ok(StartCleanupResponse {
                schedule_id: SCHEDULE_ID.into(),
                created: true,
            }),
            Err(ScheduleError::Rpc(s)) if s.code() == tonic::Code::AlreadyExists => {
                let max_age = req.max_age_minutes;
                self.client
                    .get_schedule_handle(SCHEDULE_ID)
                    .update(
                        move |u| {
                            u.set_spec(spec);
                            u.set_action(action(max_age));
                        },
                        Default::default(),
                    )
                    .await
                    .map_err(schedule_error)?;
                Ok(StartCleanupResponse {
                    schedule_id: SCHEDULE_ID.into(),
                    created: false,
                })
            }
            Err(e) => Err(schedule_error(e)),
        }
    }

    pub(super) async fn unschedule_cleanup(&self) -> Result<(), GatewayError> {
        self.client
            .get_schedule_handle(SCHEDULE_ID)
            .delete(DeleteScheduleOptions::default())
            .await
            .map_err(schedule_error)
    }
}
