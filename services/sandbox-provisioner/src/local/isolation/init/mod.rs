//! A sandbox that starts once: one long-lived bubblewrap per sandbox whose init (the
//! forwarder binary in `--init` mode, [`guest`]) runs every command of the sandbox as
//! its child, on the provisioner's request ([`host`]) over a socket pair ([`wire`]).
//! A command then costs a fork and an exec inside the sandbox, not a new bubblewrap,
//! namespaces, a cgroup-joining shell and a uid drop.

pub mod ctty;
mod ended;
pub mod guest;
pub(crate) mod host;
mod host_io;
mod terminal;
pub mod wire;
