//! Boots the real mesh for end-to-end tests: a Temporal dev server and the five service
//! binaries as separate processes on free ports, each with its state in one temp dir.
//!
//! Binaries come from `FORKYARD_BIN_DIR` or the cargo target dir this test was built
//! into; `make test` builds them first (`cargo build --workspace --bins`).
#![forbid(unsafe_code)]

pub mod fixture;
pub mod git_server;
pub mod leaks;
pub mod local_stack;
pub mod mesh;
pub mod otlp;
pub mod png;
pub mod push_gate;
pub mod replicas;
pub mod repo;
pub mod scripted_model;
pub mod support;
pub mod token_scan;
pub mod webdriver;

pub use mesh::Mesh;
