//! A fork's lifecycle rules, below both the run's workflows (which order a fork's steps)
//! and the gateway's activities (which make its calls): how a fork is finished, by one
//! function whichever path runs it ([`finish`]), what it is charged ([`charge`]), and how
//! often each of its last steps is tried ([`tries`]). Pure rules and serde types: no
//! Temporal context, no clients.

pub mod charge;
pub mod finish;
pub mod item;
pub mod tries;

use serde::{Deserialize, Serialize};

/// What the error of a fork whose sandbox was lost says (after the step's name); the
/// run recognises such forks by it and starts them again on a new sandbox.
pub const SANDBOX_LOST: &str = "sandbox lost";

/// A call about an existing sandbox, addressed to the replica that owns it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AtOwner {
    /// The sandbox's `owner_endpoint`; empty = the create address.
    pub endpoint: String,
    pub sandbox_id: String,
    /// Destroy: why (kept in the provisioner's log).
    pub reason: String,
}
