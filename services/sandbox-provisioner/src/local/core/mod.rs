//! The local backend's core: the [`provisioner::Provisioner`] and what it keeps of each
//! sandbox (`entry`), its settings (`config`), its start-up (`open`) and its lifecycle
//! without callers (`reaper`), and what every exec of a sandbox rests on: its init
//! (`sandbox_init`) and its admission and command line (`prepare`).

pub mod config;
pub(crate) mod entry;
pub(crate) mod open;
pub(crate) mod prepare;
pub mod provisioner;
pub(crate) mod reaper;
pub(crate) mod sandbox_init;
pub(crate) mod usage;
