//! agent-runner: runs one agent inside one sandbox, through the provisioner's gRPC API.
#![forbid(unsafe_code)]

pub mod activities;
pub mod agent_loop;
pub mod branch;
pub mod branch_point;
pub mod charge;
pub mod command;
pub mod command_meter;
pub mod config;
pub mod drivers;
pub mod error;
pub mod genai;
pub mod grpc;
pub mod llm;
pub mod llm_gateway;
pub mod llm_public;
pub mod loops;
pub mod models;
pub mod presets;
pub mod progress;
pub mod provisioners;
pub mod runner;
pub mod sandbox_cost;
pub mod tools;
pub mod transcript;
pub mod usage;
pub mod usage_stream;
mod usage_sum;
