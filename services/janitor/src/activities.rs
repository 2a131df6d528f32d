//! The janitor's Temporal activity (queue `janitor`): `janitor.sweep`, the same as the
//! `SweepNow` RPC, for the cleanup schedule.

use crate::{error::JanitorError, sweeper::LiveSweeper};
use forkyard_proto::janitor::v1::{SweepReport, SweepRequest};
use std::sync::Arc;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

pub struct JanitorActivities {
    sweeper: Arc<LiveSweeper>,
}

impl JanitorActivities {
    pub fn new(sweeper: Arc<LiveSweeper>) -> Self {
        Self { sweeper }
    }
}

#[activities]
impl JanitorActivities {
    #[activity(definition = forkyard_proto::activities::markers::janitor_sweep::Sweep)]
    pub async fn sweep(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: SweepRequest,
    ) -> Result<SweepReport, ActivityError> {
        self.sweeper
            .sweep(&req)
            .await
            .map_err(JanitorError::into_activity_error)
    }
}

/// Worker options for the `janitor` queue with the sweep activity registered.
pub fn worker_options(sweeper: Arc<LiveSweeper>) -> temporalio_sdk::WorkerOptions {
    temporalio_sdk::WorkerOptions::new(forkyard_proto::queues::JANITOR)
        .register_activities(JanitorActivities::new(sweeper))
        .build()
}
