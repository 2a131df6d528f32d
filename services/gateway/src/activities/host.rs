//! The host of the gateway's own activities on its orchestration queue: a wave's
//! preparation ([`super::wave`]) and a batch of inline forks' finish ([`super::finish`]),
//! over the ledger's and the provisioners' clients. The one `#[activities]` block of
//! `WaveLocal` (its activity names are part of the runs' histories: never rename).

use super::{
    finish::{self, Batch, Finish, FinishDone, FinishProgress},
    heartbeat::heartbeating,
    ledger::{self, LedgerLocal},
    sandboxes::SandboxLocal,
    wave::{Preparer, Wave, WaveDone},
};
use std::sync::{Arc, Mutex};
use temporalio_macros::activities;
use temporalio_sdk::activities::{ActivityContext, ActivityError};

/// The activities' host: the ledger's and the provisioners' clients.
pub struct WaveLocal {
    ledger: ledger::Client,
    sandboxes: SandboxLocal,
}

impl WaveLocal {
    pub fn new(ledger: &LedgerLocal, sandboxes: &SandboxLocal) -> Self {
        Self {
            ledger: ledger.client(),
            sandboxes: sandboxes.clone(),
        }
    }

    /// A finish batch that goes on from `earlier`, what an earlier attempt reached (its
    /// last heartbeat's details).
    fn finishing(&self, earlier: FinishProgress, patch_max_bytes: u64) -> Batch<'_> {
        Batch {
            ledger: &self.ledger,
            sandboxes: &self.sandboxes,
            patch_max_bytes,
            done: Mutex::new(earlier.done),
        }
    }

    /// The finish activity's work without its heartbeat: the batch's forks, those
    /// `earlier` holds as an earlier attempt left them, the others finished now.
    pub async fn finish_after(&self, earlier: FinishProgress, batch: Finish) -> FinishDone {
        let finishing = self.finishing(earlier, batch.patch_max_bytes);
        FinishDone {
            forks: finishing.all(batch.forks).await,
        }
    }
}

#[activities]
impl WaveLocal {
    /// Finish every fork of the batch at once ([`super::finish`]); never fails as a whole.
    ///
    /// Heartbeats every few seconds with the forks finished so far, so a gateway that
    /// dies mid-way is noticed within the heartbeat timeout, and the retry returns what
    /// the first attempt reached for those forks (their patch collected, spend posted,
    /// sandbox destroyed) instead of doing them again against sandboxes that are gone.
    #[activity(name = "WaveLocal.finish")]
    pub async fn finish(
        self: Arc<Self>,
        ctx: ActivityContext,
        batch: Finish,
    ) -> Result<FinishDone, ActivityError> {
        let finishing = self.finishing(finish::earlier(&ctx), batch.patch_max_bytes);
        let forks = heartbeating(&ctx, finishing.all(batch.forks), || finishing.progress()).await;
        Ok(FinishDone { forks })
    }

    /// Prepare every fork of the wave at once ([`super::wave`]); never fails as a whole.
    ///
    /// Run as a regular activity (a later wave), it heartbeats: a gateway that died
    /// mid-way is noticed within the heartbeat timeout. A no-op as a local activity.
    #[activity(name = "WaveLocal.prepare")]
    pub async fn prepare(
        self: Arc<Self>,
        ctx: ActivityContext,
        wave: Wave,
    ) -> Result<WaveDone, ActivityError> {
        let preparer = Preparer {
            ledger: &self.ledger,
            sandboxes: &self.sandboxes,
        };
        Ok(heartbeating(&ctx, preparer.all(wave), || ()).await)
    }
}
