//! The `local` backend: each sandbox is a git clone under the state directory, and its
//! commands run in bubblewrap sandboxes over it. [`Provisioner`] (`provisioner`) is its
//! core, started by `open` with its [`Config`]; each call of the session API is an
//! `impl Provisioner` of its own file over it, and `backend` serves them as a
//! `SandboxBackend`. It imports nothing of the e2b backend. The modules made public are
//! those the binaries, the tests and the crate's settings name.

pub mod backend;
pub mod bwrap;
pub mod cgroup;
pub mod cgroup_detect;
pub mod config;
mod confined;
mod create;
mod destroy;
pub mod disk_quota;
pub mod disk_usage;
mod disk_watch;
pub mod egress;
mod enter;
mod entry;
mod exec;
mod fd_walk;
mod files;
mod forwarder_kit;
mod git;
mod git_dirs;
mod git_index;
mod gitmodules;
mod health;
pub mod image;
pub mod init;
mod keyed_lock;
mod kill_tree;
mod launch;
mod llm_relay;
mod lru;
mod open;
mod open_files;
mod overlay;
mod patch;
mod patch_scan;
mod plain_command;
mod prepare;
mod process;
pub mod provisioner;
mod pty;
mod read_buf;
mod reaper;
mod remote;
mod runtime_probe;
mod sandbox_image;
mod sandbox_init;
mod seccomp;
mod session;
mod snapshot;
mod state_lock;
pub mod store;
mod stream;
mod submodules;
mod template;
mod terminal;
pub mod uids;
mod usage;
mod vfork;
mod workspace;

pub use config::Config;
pub use llm_relay::{RelayLimits, RelayLimitsArgs};
pub use provisioner::Provisioner;
pub use template::WarmBounds;
