//! Model providers behind one small interface: the tool-use loop asks for the next
//! turn, runs the tool calls it got, and hands the results back. Each provider keeps
//! the conversation in its own wire format (what the transcript records).

pub mod anthropic;
pub mod http;
pub mod openai;

use forkyard_proto::common::v1::Usage;
use serde_json::Value;
use std::fmt;

/// An API key. It is only ever sent in a request header: `Debug` and `Display` print a
/// placeholder, and error texts from a server are scrubbed of it.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Option<Self> {
        let v = value.trim().to_owned();
        (!v.is_empty()).then_some(Self(v))
    }
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
    /// `text` with every occurrence of the key replaced.
    pub fn scrub(&self, text: &str) -> String {
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Where a provider is and how it authenticates.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub key: Option<Secret>,
    pub retry: http::RetryPolicy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Value,
}

#[derive(Debug, Clone)]
pub struct ToolOutput {
    pub call: ToolCall,
    pub content: String,
    pub is_error: bool,
}

/// One model turn.
#[derive(Debug, Default)]
pub struct Turn {
    pub calls: Vec<ToolCall>,
    pub text: String,
    pub usage: Usage,
    /// Why the model stopped ("end_turn", "tool_use", "stop", "tool_calls", …).
    pub stop_reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// 400/401/403/404/422: retrying the same request cannot help.
    #[error("model API refused the request (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },
    /// 429/529/5xx or a network error, after the in-process retries ran out.
    #[error("model API unavailable (HTTP {status}) after {attempts} attempts: {message}")]
    Unavailable {
        status: u16,
        attempts: u32,
        message: String,
    },
    /// A 2xx answer that is not what the protocol says.
    #[error("model API answered something unexpected: {0}")]
    Protocol(String),
}

/// A tool the model may call, described once for both wire formats.
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: Value,
}

pub enum Provider {
    Anthropic(anthropic::Anthropic),
    OpenAi(openai::OpenAi),
}

impl Provider {
    pub async fn next_turn(&mut self) -> Result<Turn, LlmError> {
        match self {
            Self::Anthropic(p) => p.next_turn().await,
            Self::OpenAi(p) => p.next_turn().await,
        }
    }

    pub fn add_tool_outputs(&mut self, outputs: &[ToolOutput]) {
        match self {
            Self::Anthropic(p) => p.add_tool_outputs(outputs),
            Self::OpenAi(p) => p.add_tool_outputs(outputs),
        }
    }

    /// The conversation so far, in the provider's wire format.
    pub fn messages(&self) -> &[Value] {
        match self {
            Self::Anthropic(p) => &p.messages,
            Self::OpenAi(p) => &p.messages,
        }
    }

    /// Continue a conversation a failed attempt left (from its transcript).
    pub fn restore(&mut self, messages: Vec<Value>) {
        match self {
            Self::Anthropic(p) => p.messages = messages,
            Self::OpenAi(p) => p.messages = messages,
        }
    }
}

/// The system prompt both drivers send.
pub const SYSTEM_PROMPT: &str = "You are a coding agent working in a git repository checked out \
in your current directory. Use the tools to inspect and change files and to run commands. \
Paths are relative to the repository root. Make the change the user asks for, check it, and \
end your turn with a short summary when you are done.";
