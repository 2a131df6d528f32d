//! What a sandbox's commands run in, and what holds them there: the runtime
//! (`bubblewrap`; a second one, gVisor's `runsc`, would stand beside it), the sandbox's
//! init, cgroups, host uids, the open-files limit, the relays out of the sandbox
//! (`network`), and how a command is started and waited for (`command`). It knows
//! nothing of where workspaces come from (`storage`, above it).

pub mod bubblewrap;
pub mod cgroup;
pub mod cgroup_detect;
pub(crate) mod command;
pub mod host_tools;
pub mod init;
pub mod network;
pub(crate) mod open_files;
pub(crate) mod runtime_probe;
pub mod uids;

use bubblewrap::bwrap::Features;
use cgroup::Cgroups;
use network::forwarder_kit::ForwarderKit;
use runtime_probe::RuntimeProbe;
use std::{path::PathBuf, sync::Arc};
use uids::SandboxUids;

/// What sandboxes run in, as the provisioner holds it: made at start-up
/// (`crate::local::core::open`) from the settings and what the host offers. The
/// runtime's own part is bubblewrap's binary and what it can do here; a second
/// runtime's would stand beside them.
pub struct Isolation {
    /// The bubblewrap binary, resolved at start-up.
    pub(crate) bwrap: PathBuf,
    /// What bubblewrap can do on this host (`bubblewrap::bwrap`).
    pub(crate) features: Features,
    pub(crate) cgroups: Option<Cgroups>,
    /// The egress forwarder as sandboxes run it; `None`: no relays can be offered.
    pub(crate) forwarder: Option<ForwarderKit>,
    /// Host uids of sandboxes, when the provisioner runs as root (`uids`).
    pub(crate) uids: Option<Arc<SandboxUids>>,
    /// The seccomp filters every sandboxed command runs under
    /// (`bubblewrap::seccomp`); empty when the operator turned them off.
    pub(crate) seccomp: Vec<Vec<u8>>,
    /// Agent CLIs every sandbox sees at `bubblewrap::bwrap::TOOLS` (operator's choice).
    pub(crate) agent_tools: Option<PathBuf>,
    /// Toolchains every sandbox sees at `host_tools::TOOLCHAINS` (operator's choice).
    pub(crate) toolchains: Vec<host_tools::Toolchain>,
    /// The replica-wide probe of the sandbox runtime behind health checks.
    pub(crate) runtime_probe: RuntimeProbe,
}
