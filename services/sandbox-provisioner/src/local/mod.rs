//! The `local` backend: each sandbox is a git clone under the state directory, and its
//! commands run in bubblewrap sandboxes over it.

pub mod bwrap;
pub mod cgroup;
pub mod cgroup_detect;
pub(crate) mod create;
pub(crate) mod destroy;
pub mod disk_quota;
pub(crate) mod disk_watch;
pub mod egress;
pub(crate) mod enter;
pub(crate) mod entry;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod forwarder_kit;
pub(crate) mod health;
pub mod image;
pub mod init;
pub(crate) mod keyed_lock;
pub(crate) mod launch;
pub(crate) mod llm_relay;
pub(crate) mod lru;
pub(crate) mod patch;
pub(crate) mod process;
pub mod provisioner;
pub(crate) mod pty;
pub(crate) mod reaper;
pub(crate) mod sandbox_image;
pub(crate) mod seccomp;
pub(crate) mod session;
pub(crate) mod snapshot;
pub mod store;
pub(crate) mod stream;
pub(crate) mod template;
pub(crate) mod template_evict;
pub mod uids;
