//! The gateway's own activities, run by its worker on the orchestration queue (most as
//! local activities of the run workflows): a wave's preparation and a batch of inline
//! forks' finish ([`host`], the one `#[activities]` block of `WaveLocal`, over [`wave`]
//! and [`finish`]), the ledger's and the provisioners' calls ([`ledger`],
//! [`sandboxes`]), and a run's delivery ([`deliver`]).
//!
//! Below the workflows that call them, above the fork's rules they share with those
//! workflows (`crate::lifecycle`): nothing here imports `crate::workflows`.

pub mod deliver;
pub mod finish;
mod fork_span;
pub mod heartbeat;
pub mod host;
pub mod ledger;
pub mod retry;
pub mod sandboxes;
pub mod wave;
