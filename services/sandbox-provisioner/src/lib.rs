//! Forkyard's sandbox provisioner, `local` backend: each sandbox is a git clone in
//! `<state>/sandboxes/<id>/workspace`, and every command runs in a fresh bubblewrap
//! sandbox over it. [`Provisioner`] is the core; [`SandboxService`] (gRPC) and
//! [`SandboxActivities`] (Temporal `local.*`) are its two front doors.
#![deny(unsafe_code)]

pub mod activities;
pub mod backend;
pub mod bwrap;
pub mod cgroup;
pub mod cgroup_detect;
pub mod config;
mod create;
mod destroy;
pub mod disk_quota;
mod disk_watch;
pub mod e2b;
pub mod egress;
mod enter;
mod entry;
pub mod error;
mod exec;
mod files;
mod forwarder_kit;
mod git;
pub mod grpc;
mod health;
pub mod image;
pub mod init;
mod keyed_lock;
mod launch;
mod lifecycle;
mod llm_relay;
mod lru;
mod patch;
mod process;
pub mod provisioner;
mod pty;
mod reaper;
mod sandbox_image;
mod seccomp;
mod session;
mod snapshot;
pub mod store;
mod stream;
mod template;
mod template_evict;
pub mod uids;
pub mod usage;
mod validate;

pub use activities::{E2bActivities, SandboxActivities};
pub use backend::{Backends, SandboxBackend};
pub use config::Args;
pub use error::ProvisionerError;
pub use grpc::SandboxService;
pub use provisioner::{Config, Provisioner};
