//! The meter on a response's way back: its usage read as the body streams to the agent,
//! priced and charged to the fork once the body is done with.

use super::{gateway::LlmGateway, grants::Grant, meter::Meter};
use std::sync::Arc;
use tracing::Instrument as _;

/// Reads a response's usage as it passes; when the body is done with (finished, failed
/// or dropped by a client that hung up) it prices what was used and charges it.
pub(super) struct Tap {
    pub(super) gw: Arc<LlmGateway>,
    pub(super) grant: Arc<Grant>,
    pub(super) seq: u32,
    /// The request's (allowed) model: the price, unless the table knows the one the
    /// response names.
    pub(super) model: String,
    pub(super) meter: Meter,
    /// The request's span: open until the response is delivered and charged.
    pub(super) span: tracing::Span,
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.meter.finish();
        let model = match &self.meter.model {
            Some(m) if self.gw.models.knows(m) => m.clone(),
            _ => self.model.clone(),
        };
        let usage = self.meter.usage;
        crate::genai::record_usage(&self.span, self.meter.model.as_deref(), &usage);
        let cost = self.gw.models.price(&model).cost_micros(&usage);
        let (grant, seq) = (self.grant.clone(), self.seq);
        grant.delivered();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(
                    async move { grant.finish(seq, usage, cost).await }
                        .instrument(self.span.clone()),
                );
            }
            Err(_) => grant.undeliver(),
        }
    }
}
