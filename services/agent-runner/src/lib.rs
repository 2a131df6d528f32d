//! agent-runner: runs one agent inside one sandbox, through the provisioner's gRPC API.
#![forbid(unsafe_code)]

pub mod activities;
pub mod command;
pub mod error;
pub mod grpc;
pub mod usage;
