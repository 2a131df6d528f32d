//! Forkyard's sandbox provisioner, `local` backend: each sandbox is a git clone in
//! `<state>/sandboxes/<id>/workspace`, and every command runs in a fresh bubblewrap
//! sandbox over it. [`Provisioner`] is the core; [`SandboxService`] (gRPC) and
//! [`SandboxActivities`] (Temporal `local.*`) are its two front doors.
#![deny(unsafe_code)]

pub mod activities;
pub mod backend;
pub mod config;
pub mod e2b;
pub mod error;
mod git;
pub mod grpc;
pub mod limits;
pub mod local;
mod metrics;
pub mod router;
pub mod usage;
mod validate;

pub use activities::{E2bActivities, SandboxActivities};
pub use backend::SandboxBackend;
pub use config::Args;
pub use error::ProvisionerError;
pub use grpc::SandboxService;
pub use local::{Config, Provisioner};
pub use router::Backends;
