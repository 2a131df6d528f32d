//! The gateway: Forkyard's public gRPC API and the host of the run workflows.
#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod config;
pub mod deliver;
pub mod egress_policy;
pub mod error;
pub mod finish;
mod fork_span;
pub mod fork_telemetry;
pub mod heartbeat;
pub mod ledger;
pub mod money;
pub mod repo_check;
pub mod repo_policy;
pub mod retry;
pub mod sandboxes;
pub mod search;
pub mod search_attributes;
pub mod tenant_policy;
pub mod validate;
pub mod wave;
pub mod worker;
pub mod workflows;
