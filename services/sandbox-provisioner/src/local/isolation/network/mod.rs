//! A sandbox's only ways out: the egress allowlist proxy (`egress`), the relay to the
//! LLM gateway (`llm_relay`), and the forwarder binary that exposes both inside the
//! sandbox (`forwarder_kit`).

pub mod egress;
pub(crate) mod forwarder_kit;
pub(crate) mod llm_relay;
