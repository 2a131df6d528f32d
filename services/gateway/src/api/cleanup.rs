//! StartCleanup / StopCleanup: the janitor's Temporal Schedule. Each tick runs
//! `ScheduledCleanupWorkflow`, whose sweep activity runs on the janitor's queue.
//!
//! A fresh deployment sweeps without anyone asking: each gateway creates the schedule at
//! start when it does not exist ([`ensure_default`], `--cleanup-interval-minutes`), and
//! leaves one that does exist as it is. So StopCleanup pauses the schedule rather than
//! deleting it: a deleted one would come back at the next gateway start.

use super::GatewayService;
use crate::{error::GatewayError, workflows::cleanup::ScheduledCleanupWorkflow};
use forkyard_proto::{
    gateway::v1::{StartCleanupRequest, StartCleanupResponse},
    janitor::v1::SweepRequest,
    queues,
};
use std::time::Duration;
use temporalio_client::schedules::{
    CreateScheduleOptions, ScheduleAction, ScheduleError, ScheduleOverlapPolicy, ScheduleSpec,
};

pub const SCHEDULE_ID: &str = "forkyard-cleanup";
pub const MAX_INTERVAL_MINUTES: u32 = 24 * 60;
pub const MAX_AGE_MINUTES: u32 = 7 * 24 * 60;

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

fn every(interval_minutes: u32) -> ScheduleSpec {
    ScheduleSpec::from_interval(Duration::from_secs(u64::from(interval_minutes) * 60))
}

/// The schedule: a sweep every `interval_minutes`, one at a time.
fn options(interval_minutes: u32, max_age_minutes: u32) -> CreateScheduleOptions {
    CreateScheduleOptions::builder()
        .action(action(max_age_minutes))
        .spec(every(interval_minutes))
        .overlap_policy(ScheduleOverlapPolicy::Skip)
        .build()
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
        let spec = every(req.interval_minutes);
        let opts = options(req.interval_minutes, req.max_age_minutes);
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
                            // Started again after a StopCleanup.
                            u.set_paused(false);
                            u.set_note("");
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

    /// Pause the schedule (kept, so no gateway start makes it anew); stopping a stopped
    /// one is not an error.
    pub(super) async fn unschedule_cleanup(&self) -> Result<(), GatewayError> {
        self.client
            .get_schedule_handle(SCHEDULE_ID)
            .pause(Some(STOPPED_NOTE), Default::default())
            .await
            .map_err(schedule_error)
    }
}

/// The note a stopped schedule carries.
pub const STOPPED_NOTE: &str =
    "stopped with StopCleanup (forkyard stop-cleanup); StartCleanup resumes it";

/// The schedule a fresh deployment sweeps on: created when there is none (every gateway
/// tries at start; the first wins), never changed when there is one, paused or not. A
/// failure is logged, never fatal: sweeps are a safety net, and `forkyard cleanup` can
/// still make the schedule.
pub async fn ensure_default(
    client: &temporalio_client::Client,
    interval_minutes: u32,
    max_age_minutes: u32,
) {
    if interval_minutes == 0 {
        return;
    }
    match client
        .create_schedule(SCHEDULE_ID, options(interval_minutes, max_age_minutes))
        .await
    {
        Ok(_) => tracing::info!(
            schedule_id = SCHEDULE_ID,
            interval_minutes,
            max_age_minutes,
            "cleanup schedule created"
        ),
        Err(ScheduleError::Rpc(s)) if s.code() == tonic::Code::AlreadyExists => {}
        Err(e) => tracing::warn!(
            schedule_id = SCHEDULE_ID,
            error = %e,
            "cannot create the default cleanup schedule; `forkyard cleanup` makes it"
        ),
    }
}
