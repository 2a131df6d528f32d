//! The metering LLM gateway: the only way a fork's agent reaches a model.
//!
//! It lives in the agent runner because the runner already holds what it needs and
//! nothing in a sandbox's host should: the API keys (`ANTHROPIC_API_KEY`,
//! `OPENAI_API_KEY`), the price table, the ledger connection with its idempotent
//! charges, and the lifetime of each agent (a fork's token lives exactly as long as its
//! command). The provisioner only relays bytes from the sandbox's loopback to here,
//! announcing the sandbox in a PROXY v2 header; the provisioner's host, where untrusted
//! code runs, never holds a key.
//!
//! Per request: the fork's token (`x-api-key` or `Authorization: Bearer`) must be live
//! and presented from its own sandbox; the model must be allowed; the real key replaces
//! the token; the response streams back untouched while its usage is read; the usage is
//! priced and charged to the fork's reservation under a key unique to the request. Once
//! the reservation refuses a charge, further requests are refused and the fork's driver
//! stops the agent (`BUDGET_EXCEEDED`).

pub mod capture;
mod checks;
mod forward;
mod gateway;
pub mod grants;
pub mod meter;
mod metrics;
mod proxy;
mod reply;
mod tap;

pub use gateway::LlmGateway;
pub use proxy::{DEFAULT_LIMITS, serve, serve_public, serve_within};
