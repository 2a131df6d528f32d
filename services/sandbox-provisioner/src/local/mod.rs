//! The `local` backend: each sandbox is a git clone under the state directory, and its
//! commands run in bubblewrap sandboxes over it. Its floors, each importing only those
//! below it:
//!
//! - `api`: the session API's verbs (create, exec, destroy, snapshot, ...), each an
//!   `impl Provisioner` of its own file, and `backend`, which serves them as a
//!   `SandboxBackend`.
//! - `core`: the [`Provisioner`] and what it keeps of each sandbox, its [`Config`],
//!   start-up (`open`), the reaper, and what every exec goes through (`prepare`).
//! - `storage`: what lives on disk: sandbox records, workspaces (templates, overlays,
//!   snapshots), images, disk quotas, and the repositories host git reads.
//! - `isolation`: what a sandbox runs in: bubblewrap, its init, seccomp, cgroups, uids,
//!   and the egress and LLM relays. A second runtime stands beside `bubblewrap`.
//! - `base`: what knows nothing of sandboxes: descriptor walks, confined changes to a
//!   tree, locks, buffers.
//!
//! It imports nothing of the e2b backend. The modules made public are those the
//! binaries, the tests and the crate's settings name.

pub mod api;
pub mod base;
pub mod core;
pub mod isolation;
pub mod storage;

pub use self::core::{config::Config, provisioner::Provisioner};
pub use isolation::network::llm_relay::{RelayLimits, RelayLimitsArgs};
pub use storage::template::WarmBounds;
