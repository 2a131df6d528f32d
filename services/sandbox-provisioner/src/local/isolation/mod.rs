//! What a sandbox's commands run in, and what holds them there: the runtime
//! (`bubblewrap`, or gVisor's `runsc` for a sandbox that asks for it: `gvisor`), the sandbox's
//! init, cgroups, host uids, the open-files limit, the relays out of the sandbox
//! (`network`), and how a command is started and waited for (`command`). It knows
//! nothing of where workspaces come from (`storage`, above it).

pub mod bubblewrap;
pub mod cgroup;
pub mod cgroup_detect;
pub(crate) mod command;
pub mod gvisor;
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
    /// gVisor's runsc, for sandboxes created with `isolation: gvisor` (`gvisor`).
    pub(crate) gvisor: gvisor::Gvisor,
}

/// What holds a sandbox's commands, chosen at its create and kept in its record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Namespaces, seccomp and cgroups over the host's kernel (`bubblewrap`).
    #[default]
    Bubblewrap,
    /// gVisor's user-space kernel (`gvisor`): the sandbox's system calls never reach
    /// the host's kernel directly.
    Gvisor,
}

impl Kind {
    /// A create's `isolation`: empty is the default; anything but the names of
    /// [`forkyard_proto::ISOLATIONS`] is refused, naming them.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name.trim() {
            "" | "bubblewrap" => Ok(Self::Bubblewrap),
            "gvisor" => Ok(Self::Gvisor),
            other => Err(format!(
                "{other:?} is not an isolation level (one of: {})",
                forkyard_proto::ISOLATIONS.join(", ")
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bubblewrap => "bubblewrap",
            Self::Gvisor => "gvisor",
        }
    }
}
