//! The gateway: Forkyard's public gRPC API and the host of the run workflows.
#![forbid(unsafe_code)]

pub mod activities;
pub mod api;
pub mod auth;
pub mod backend_policy;
pub mod config;
pub mod egress_policy;
pub mod error;
mod fork_metrics;
pub mod fork_telemetry;
pub mod lifecycle;
pub mod repo_check;
pub mod repo_policy;
pub mod search;
pub mod search_attributes;
pub mod tenant_policy;
pub mod validate;
pub mod worker;
pub mod workflows;
