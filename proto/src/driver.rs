//! The agent drivers: the one list every crate reads (the gateway's validation, the
//! CLI's `--driver`, the runner's dispatch and its `CheckDriver` answer), with what each
//! can do. On the wire a driver stays its name (`AgentSpec.driver`, a string): runs
//! recorded in Temporal's histories carry those names, and grpcurl users type them, so
//! the names are the contract and this enum is how Rust code holds one.
//!
//! Adding a driver: a variant here (its name and capabilities), its program or loop in
//! the agent runner (`presets.rs` for a CLI, `drivers.rs` for a model loop), and the
//! docs (`docs/agent-drivers.md`). Nothing else lists drivers.

use std::fmt;

/// An agent driver: what runs a fork's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Driver {
    /// The caller's shell command, in the sandbox (`AgentSpec.command`).
    Command,
    /// Claude Code (`claude -p`), in the sandbox, through the runner's LLM gateway.
    ClaudeCode,
    /// OpenAI's Codex CLI (`codex exec`), in the sandbox, through the runner's LLM gateway.
    Codex,
    /// The runner's own tool-use loop on Anthropic's Messages API.
    Anthropic,
    /// The runner's own tool-use loop on OpenAI's Chat Completions API.
    OpenAi,
}

/// A model provider: whose API key a driver needs and whose API it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    Anthropic,
    OpenAi,
}

/// Where a driver's token usage (and price, if any) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Usage {
    /// What the command prints: a Claude-style JSON result or Codex-style JSON lines,
    /// whichever it printed (and the LLM gateway's meter, if it calls a model through it).
    Reported,
    /// The runner's LLM gateway meters every model call the CLI makes.
    Metered,
    /// The runner's own loop reads each API response's usage.
    Loop,
}

/// What a driver can do, which decides how the runner and the gateway treat it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// A program run inside the sandbox (the runner starts it and meters it), rather than
    /// a model loop in the runner that runs its tool calls in the sandbox.
    pub in_sandbox: bool,
    /// The provider whose key it needs at the runner (`None`: none of its own).
    pub provider: Option<Provider>,
    /// Talks to its model only through the runner's LLM gateway (which holds the key).
    pub needs_llm_gateway: bool,
    /// Its conversation can be continued in a later agent run, by the session id its run
    /// reports: the CLI's own resume, or the built-in loop's conversation kept in the
    /// workspace under that id.
    pub resumable: bool,
    pub usage: Usage,
}

impl Driver {
    /// Every driver, in the order help texts list them.
    pub const ALL: [Self; 5] = [
        Self::Command,
        Self::ClaudeCode,
        Self::Codex,
        Self::Anthropic,
        Self::OpenAi,
    ];

    /// Its name on the wire and on command lines.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Command => "command",
            Self::ClaudeCode => "claude-code",
            Self::Codex => "codex",
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
        }
    }

    /// The driver a spec names: `""` is the command driver (the default); `None` for a
    /// name no driver has.
    pub fn parse(name: &str) -> Option<Self> {
        if name.is_empty() {
            return Some(Self::Command);
        }
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Every name, for an error or a help text: `command, claude-code, …`.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    pub const fn capabilities(self) -> Capabilities {
        let (in_sandbox, provider, needs_llm_gateway, resumable, usage) = match self {
            Self::Command => (true, None, false, false, Usage::Reported),
            Self::ClaudeCode => (true, Some(Provider::Anthropic), true, true, Usage::Metered),
            Self::Codex => (true, Some(Provider::OpenAi), true, true, Usage::Metered),
            Self::Anthropic => (false, Some(Provider::Anthropic), false, true, Usage::Loop),
            Self::OpenAi => (false, Some(Provider::OpenAi), false, true, Usage::Loop),
        };
        Capabilities {
            in_sandbox,
            provider,
            needs_llm_gateway,
            resumable,
            usage,
        }
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_driver_and_empty_is_the_command_driver() {
        for d in Driver::ALL {
            assert_eq!(Driver::parse(d.name()), Some(d));
        }
        assert_eq!(Driver::parse(""), Some(Driver::Command));
        for bad in ["Claude-Code", "claude", " codex", "gemini"] {
            assert_eq!(Driver::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            Driver::names(),
            "command, claude-code, codex, anthropic, openai"
        );
    }

    #[test]
    fn the_clis_run_in_the_sandbox_through_the_gateway_and_the_loops_in_the_runner() {
        for d in Driver::ALL {
            let c = d.capabilities();
            // A model loop runs in the runner with the key; a CLI never holds one.
            assert!(!c.needs_llm_gateway || c.in_sandbox, "{d}");
            assert_eq!(c.usage == Usage::Loop, !c.in_sandbox, "{d}");
            assert_eq!(c.provider.is_none(), d == Driver::Command, "{d}");
        }
    }
}
