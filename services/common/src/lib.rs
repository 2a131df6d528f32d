//! What every Forkyard service shares: flags, telemetry, shutdown, the gRPC server
//! bootstrap (health + reflection) and the Temporal connection and worker.
#![forbid(unsafe_code)]

pub mod activity;
pub mod activity_telemetry;
pub mod advertise;
pub mod allowed_hosts;
pub mod backoff;
pub mod balance;
pub mod clock;
pub mod config;
pub mod discovery;
pub mod e2b_egress;
#[cfg(feature = "test-support")]
pub mod fake_e2b;
#[cfg(any(test, feature = "test-support"))]
pub mod fake_forge;
pub mod fault;
pub mod forge;
pub mod git_credentials;
pub mod git_pin;
pub mod git_refs;
pub mod github_app;
pub mod grpc_telemetry;
pub mod host_git;
pub mod hosts;
pub mod http_limits;
pub mod image_reference;
pub mod metrics;
mod metrics_registry;
mod otlp_export;
pub mod pool;
pub mod private_files;
pub mod proxy_header;
pub mod repo_location;
pub mod secret;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod startup;
pub mod status;
pub mod telemetry;
pub mod temporal;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod text;
pub mod tls;
pub mod waiting;

pub use config::{StateDirArg, TemporalArgs, exit_config_error};
