//! Forkyard's budget ledger: accounts, reservations, commits and releases in integer
//! micro-USD, every posting keyed by an idempotency key. Served over gRPC
//! ([`grpc::LedgerService`]) and as Temporal activities ([`activities::LedgerActivities`]).
#![forbid(unsafe_code)]

pub mod activities;
pub mod error;
pub mod grpc;
mod model;
pub mod store;
mod validate;

pub use error::LedgerError;
pub use grpc::LedgerService;
pub use store::LedgerStore;

/// Default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50054";
