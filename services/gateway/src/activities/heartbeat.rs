//! The heartbeat of the gateway's own activities while they run.

use temporalio_sdk::activities::ActivityContext;

/// How often the gateway's own activities heartbeat while they run (their heartbeat
/// timeout is a few times this).
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// `work`, heartbeating `details()` every [`HEARTBEAT_EVERY`] while it runs.
pub(crate) async fn heartbeating<T, D>(
    ctx: &ActivityContext,
    work: impl std::future::Future<Output = T>,
    details: impl Fn() -> D,
) -> T
where
    D: temporalio_common::data_converters::TemporalSerializable + 'static,
{
    tokio::pin!(work);
    let mut beat = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = beat.tick() => {
                if let Err(e) = ctx.record_heartbeat(details()).await {
                    tracing::warn!(activity = %ctx.info().activity_type, error = %e, "heartbeat not recorded");
                }
            }
        }
    }
}
