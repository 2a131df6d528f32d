//! What a sandbox's commands run in, and what holds them there: the runtime
//! (`bubblewrap`; a second one, gVisor's `runsc`, would stand beside it), the sandbox's
//! init, cgroups, host uids, the open-files limit, the relays out of the sandbox
//! (`network`), and how a command is started and waited for (`command`). It knows
//! nothing of where workspaces come from (`storage`, above it).

pub mod bubblewrap;
pub mod cgroup;
pub mod cgroup_detect;
pub(crate) mod command;
pub mod init;
pub mod network;
pub(crate) mod open_files;
pub(crate) mod runtime_probe;
pub mod uids;
