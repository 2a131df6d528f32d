//! The bubblewrap runtime: the command line for one sandboxed command (`bwrap`), the
//! child that starts it without copying the provisioner (`vfork`) and what that child
//! does before the exec (`enter`), the seccomp filter bwrap installs, and killing a
//! started bubblewrap with everything in its sandbox (`kill_tree`); what bubblewrap can
//! do on this host, tried at start-up (`probe`).

pub mod bwrap;
pub(crate) mod enter;
pub(crate) mod kill_tree;
pub mod probe;
pub(crate) mod seccomp;
pub(crate) mod vfork;
