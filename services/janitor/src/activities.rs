//! The janitor's Temporal activity (queue `janitor`): `janitor.sweep`, the same as the
//! `SweepNow` RPC, for the cleanup schedule.

use crate::{error::JanitorError, sweeper::LiveSweeper};
use forkyard_proto::{
    activities::JanitorSweep,
    janitor::v1::{SweepReport, SweepRequest},
};
use std::sync::Arc;
use temporalio_common::ActivityDefinition;
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

/// The contract's name, checked at compile time to take `I` and return `O` (the proto
/// crate's marker types are private; its public consts are not).
fn contract<I, O, D>(definition: &'static D) -> &'static str
where
    D: ActivityDefinition<Input = I, Output = O>,
{
    definition.name()
}

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
    #[activity(name = contract::<SweepRequest, SweepReport, _>(&JanitorSweep::sweep))]
    pub async fn sweep(
        self: Arc<Self>,
        _ctx: ActivityContext,
        req: SweepRequest,
    ) -> Result<SweepReport, ActivityError> {
        self.sweeper.sweep(&req).await.map_err(JanitorError::into_activity_error)
    }
}

/// Worker options for the `janitor` queue with the sweep activity registered.
pub fn worker_options(sweeper: Arc<LiveSweeper>) -> temporalio_sdk::WorkerOptions {
    temporalio_sdk::WorkerOptions::new(forkyard_proto::queues::JANITOR)
        .register_activities(JanitorActivities::new(sweeper))
        .build()
}
