//! Forkyard's janitor: finds sandboxes whose owning workflow is gone (closed, unknown to
//! Temporal, or never labelled) or that outlived the max age and destroys them through
//! the sandbox provisioner, and releases ledger reservations whose fork is gone. Served
//! as the `Janitor.SweepNow` RPC and the `janitor.sweep` activity.
#![forbid(unsafe_code)]

pub mod activities;
pub mod classify;
pub mod error;
pub mod grpc;
pub mod metrics;
pub mod reservations;
pub mod sandboxes;
mod snapshots;
pub mod sweeper;
pub mod workflows;

pub use error::JanitorError;
pub use grpc::JanitorService;
pub use sandboxes::{GrpcSandboxes, Sandboxes};
pub use sweeper::{LiveSweeper, Sweeper};
pub use workflows::Workflows;

/// Default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50055";
/// Default `--metrics-listen`.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9455";
/// Default `--ledger-addr`.
pub const DEFAULT_LEDGER_ADDR: &str = "http://127.0.0.1:50054";
/// Default `--provisioner-addr`.
pub const DEFAULT_PROVISIONER_ADDR: &str = "http://127.0.0.1:50052";
