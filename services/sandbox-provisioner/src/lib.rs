//! Forkyard's sandbox provisioner: sandboxes for agents' commands, on two backends
//! behind one trait ([`SandboxBackend`], `backend`).
//!
//! - `local/`: each sandbox a git clone in `<state>/sandboxes/<id>/workspace`, its
//!   commands run in bubblewrap over it; [`Provisioner`] is its core.
//! - `e2b/`: sandboxes on E2B, through its REST API and envd.
//!
//! Neither backend imports the other. What both use stands at the top: `limits` (output
//! and patch caps, the state selector, the clock), `metrics`, `usage` (prices), `git`,
//! `validate` and `error`. [`Backends`] (`router`) owns the backends and routes each
//! request to one; [`SandboxService`] (gRPC) and the Temporal activities
//! ([`SandboxActivities`] `local.*`, [`E2bActivities`] `e2b.*`) are the front doors, and
//! [`Args`] (`config`) the flags both backends' settings come from.
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
pub mod maxima;
mod metrics;
pub mod patch_records;
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
