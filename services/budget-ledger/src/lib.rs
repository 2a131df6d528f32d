//! Forkyard's budget ledger: tenant and run accounts, reservations, incremental charges,
//! commits and releases in integer micro-USD, posted in double entry, every mutating call
//! keyed by an idempotency key so Temporal's retries post exactly once. SQLite (default)
//! or PostgreSQL through the same code. Served over gRPC ([`grpc::LedgerService`]) and as
//! Temporal activities ([`activities::LedgerActivities`]).
#![forbid(unsafe_code)]

mod accounts;
pub mod activities;
pub mod db;
pub mod error;
mod flush;
pub mod grpc;
mod idempotency;
mod load;
mod model;
mod postings;
mod report;
mod reservations;
pub mod store;
mod validate;
mod workset;
mod writer;

pub use db::Backend;
pub use error::LedgerError;
pub use grpc::LedgerService;
pub use model::MAX_AMOUNT_MICROS;
pub use store::LedgerStore;

/// Default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50054";
