//! The tools an LLM agent gets, executed inside the fork's sandbox through the
//! provisioner's gRPC API: bash, read_file, write_file, edit, list_files. A tool's
//! failure (bad arguments, missing file, non-zero exit) is reported to the model as an
//! error result; only a sandbox that is gone or unreachable stops the agent.

use crate::{error::AgentError, llm::ToolSpec};
use forkyard_common::grpc_telemetry::TracedChannel as Channel;
use forkyard_proto::sandbox::v1::{
    ExecRequest, ReadFileRequest, WriteFileRequest,
    sandbox_provisioner_client::SandboxProvisionerClient,
};
use serde_json::{Value, json};
use std::{collections::HashMap, time::Duration};

const DEFAULT_BASH_TIMEOUT_SECS: u64 = 120;
const MAX_BASH_TIMEOUT_SECS: u64 = 600;
/// What one tool result may put into the context window.
const MAX_RESULT_BYTES: usize = 30_000;
const MAX_READ_BYTES: u64 = 1 << 20;

pub fn specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "bash",
            description: "Run a shell command (bash -c) in the repository root and return its exit code, stdout and stderr.",
            schema: json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The command line"},
                "timeout_secs": {"type": "integer", "description": "Wall-clock limit (default 120, at most 600)"}},
                "required": ["command"]}),
        },
        ToolSpec {
            name: "read_file",
            description: "Read a text file (path relative to the repository root).",
            schema: json!({"type": "object", "properties": {
                "path": {"type": "string"}}, "required": ["path"]}),
        },
        ToolSpec {
            name: "write_file",
            description: "Create or overwrite a file with the given content.",
            schema: json!({"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}),
        },
        ToolSpec {
            name: "edit",
            description: "Replace an exact string in a file. old_string must occur exactly once unless replace_all is true.",
            schema: json!({"type": "object", "properties": {
                "path": {"type": "string"}, "old_string": {"type": "string"},
                "new_string": {"type": "string"}, "replace_all": {"type": "boolean"}},
                "required": ["path", "old_string", "new_string"]}),
        },
        ToolSpec {
            name: "list_files",
            description: "List files under a directory (default: the repository root), up to 3 levels deep, without .git.",
            schema: json!({"type": "object", "properties": {
                "path": {"type": "string"}}}),
        },
    ]
}

/// A tool's answer to the model.
pub struct Outcome {
    pub content: String,
    pub is_error: bool,
    /// The command was stopped because the workspace grew past the sandbox's disk
    /// limit: the agent ends here.
    pub over_disk_limit: bool,
}

fn ok(content: String) -> Outcome {
    Outcome {
        content: clip(content),
        is_error: false,
        over_disk_limit: false,
    }
}

fn err(content: impl Into<String>) -> Outcome {
    Outcome {
        content: clip(content.into()),
        is_error: true,
        over_disk_limit: false,
    }
}

/// Keep the head and the tail of long output: errors tend to be at the end.
fn clip(s: String) -> String {
    if s.len() <= MAX_RESULT_BYTES {
        return s;
    }
    let half = MAX_RESULT_BYTES / 2;
    let mut head = half;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - half;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[… {} bytes cut …]\n{}",
        &s[..head],
        tail - head,
        &s[tail..]
    )
}

fn str_arg<'a>(input: &'a Value, name: &str) -> Result<&'a str, Outcome> {
    input
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| err(format!("missing string argument {name:?}")))
}

/// One-line description of a call for heartbeats and logs.
pub fn describe(name: &str, input: &Value) -> String {
    let arg = ["command", "path"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .unwrap_or("");
    let line: String = arg.lines().next().unwrap_or("").chars().take(120).collect();
    if line.is_empty() {
        name.to_owned()
    } else {
        format!("{name}: {line}")
    }
}

pub struct Sandbox {
    pub client: SandboxProvisionerClient<Channel>,
    pub endpoint: String,
    pub sandbox_id: String,
    /// What every tool command sees: the run's names (`FORKYARD_RUN_ID`,
    /// `FORKYARD_FORK`), as the CLI drivers' commands do.
    pub env: HashMap<String, String>,
}

impl Sandbox {
    fn failed(&self, s: &tonic::Status) -> Option<AgentError> {
        match s.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal => {
                Some(AgentError::Unavailable {
                    endpoint: self.endpoint.clone(),
                    message: s.message().to_owned(),
                })
            }
            tonic::Code::NotFound => Some(AgentError::Sandbox {
                sandbox_id: self.sandbox_id.clone(),
                message: s.message().to_owned(),
            }),
            _ => None,
        }
    }

    /// Run one tool call. `remaining` is what is left of the fork's time.
    pub async fn run(
        &mut self,
        name: &str,
        input: &Value,
        remaining: Duration,
    ) -> Result<Outcome, AgentError> {
        let out = match name {
            "bash" => self.bash(input, remaining).await?,
            "read_file" => match str_arg(input, "path") {
                Ok(p) => match self.read(p).await? {
                    Ok(text) => ok(text),
                    Err(e) => e,
                },
                Err(e) => e,
            },
            "write_file" => match (str_arg(input, "path"), str_arg(input, "content")) {
                (Ok(p), Ok(c)) => self.write(p, c).await?,
                (Err(e), _) | (_, Err(e)) => e,
            },
            "edit" => self.edit(input).await?,
            "list_files" => {
                self.list(input.get("path").and_then(Value::as_str).unwrap_or("."))
                    .await?
            }
            other => err(format!(
                "unknown tool {other:?}; tools: bash, read_file, write_file, edit, list_files"
            )),
        };
        Ok(out)
    }

    async fn exec(
        &mut self,
        argv: Vec<String>,
        timeout_secs: u64,
    ) -> Result<Result<forkyard_proto::sandbox::v1::ExecResponse, Outcome>, AgentError> {
        let req = ExecRequest {
            sandbox_id: self.sandbox_id.clone(),
            argv,
            env: self.env.clone(),
            timeout_secs: u32::try_from(timeout_secs.max(1)).unwrap_or(u32::MAX),
            ..Default::default()
        };
        match self.client.exec(req).await {
            Ok(r) => Ok(Ok(r.into_inner())),
            Err(s) => match self.failed(&s) {
                Some(e) => Err(e),
                None => Ok(Err(err(s.message().to_owned()))),
            },
        }
    }

    async fn bash(&mut self, input: &Value, remaining: Duration) -> Result<Outcome, AgentError> {
        let command = match str_arg(input, "command") {
            Ok(c) => c.to_owned(),
            Err(e) => return Ok(e),
        };
        let asked = input
            .get("timeout_secs")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_BASH_TIMEOUT_SECS)
            .clamp(1, MAX_BASH_TIMEOUT_SECS);
        let timeout = asked.min(remaining.as_secs().max(1));
        let out = match self
            .exec(vec!["bash".into(), "-c".into(), command], timeout)
            .await?
        {
            Ok(o) => o,
            Err(e) => return Ok(e),
        };
        let mut text = format!("exit code: {}", out.exit_code);
        if out.timed_out {
            text.push_str(&format!(" (killed after {timeout} s)"));
        }
        if out.workspace_over_limit {
            text.push_str(" (stopped: the workspace grew past the sandbox's disk limit)");
        }
        if !out.stdout.is_empty() {
            text.push_str("\nstdout:\n");
            text.push_str(&out.stdout);
        }
        if !out.stderr.is_empty() {
            text.push_str("\nstderr:\n");
            text.push_str(&out.stderr);
        }
        Ok(Outcome {
            content: clip(text),
            is_error: out.exit_code != 0 || out.timed_out,
            over_disk_limit: out.workspace_over_limit,
        })
    }

    async fn read(&mut self, path: &str) -> Result<Result<String, Outcome>, AgentError> {
        let req = ReadFileRequest {
            sandbox_id: self.sandbox_id.clone(),
            path: path.to_owned(),
            max_bytes: MAX_READ_BYTES,
        };
        match self.client.read_file(req).await {
            Ok(r) => {
                let r = r.into_inner();
                let mut text = String::from_utf8_lossy(&r.content).into_owned();
                if r.truncated {
                    text.push_str(&format!("\n[file is {} bytes; cut]", r.size));
                }
                Ok(Ok(text))
            }
            Err(s) if s.code() == tonic::Code::NotFound && !s.message().contains("sandbox") => {
                Ok(Err(err(format!("{path}: no such file"))))
            }
            Err(s) => match self.failed(&s) {
                Some(e) => Err(e),
                None => Ok(Err(err(format!("{path}: {}", s.message())))),
            },
        }
    }

    async fn write(&mut self, path: &str, content: &str) -> Result<Outcome, AgentError> {
        // Models expect write_file to create missing directories, as editors do.
        if let Some((parent, _)) = path.rsplit_once('/')
            && !parent.is_empty()
            && let Err(e) = self
                .exec(
                    vec!["mkdir".into(), "-p".into(), "--".into(), parent.into()],
                    30,
                )
                .await?
        {
            return Ok(e);
        }
        let req = WriteFileRequest {
            sandbox_id: self.sandbox_id.clone(),
            path: path.to_owned(),
            content: content.as_bytes().to_vec(),
            mode: 0,
        };
        match self.client.write_file(req).await {
            Ok(r) => Ok(ok(format!(
                "wrote {} bytes to {path}",
                r.into_inner().bytes_written
            ))),
            Err(s) => match self.failed(&s) {
                Some(e) if !s.message().contains(path) => Err(e),
                _ => Ok(err(format!("{path}: {}", s.message()))),
            },
        }
    }

    async fn edit(&mut self, input: &Value) -> Result<Outcome, AgentError> {
        let (path, old, new) = match (
            str_arg(input, "path"),
            str_arg(input, "old_string"),
            str_arg(input, "new_string"),
        ) {
            (Ok(p), Ok(o), Ok(n)) => (p.to_owned(), o.to_owned(), n.to_owned()),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Ok(e),
        };
        if old.is_empty() {
            return Ok(err("old_string is empty; use write_file to create a file"));
        }
        let all = input
            .get("replace_all")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let text = match self.read(&path).await? {
            Ok(t) => t,
            Err(e) => return Ok(e),
        };
        let n = text.matches(old.as_str()).count();
        if n == 0 {
            return Ok(err(format!("{path}: old_string not found")));
        }
        if n > 1 && !all {
            return Ok(err(format!(
                "{path}: old_string occurs {n} times; give more context or set replace_all"
            )));
        }
        let edited = if all {
            text.replace(old.as_str(), &new)
        } else {
            text.replacen(old.as_str(), &new, 1)
        };
        let out = self.write(&path, &edited).await?;
        if out.is_error {
            return Ok(out);
        }
        Ok(ok(format!("replaced {n} occurrence(s) in {path}")))
    }

    async fn list(&mut self, path: &str) -> Result<Outcome, AgentError> {
        let argv = [
            "find",
            path,
            "-maxdepth",
            "3",
            "-name",
            ".git",
            "-prune",
            "-o",
            "-print",
        ];
        let out = match self
            .exec(argv.iter().map(|s| (*s).to_owned()).collect(), 30)
            .await?
        {
            Ok(o) => o,
            Err(e) => return Ok(e),
        };
        if out.exit_code != 0 {
            return Ok(err(format!("{path}: {}", out.stderr.trim())));
        }
        let mut lines: Vec<&str> = out.stdout.lines().take(2000).collect();
        lines.sort_unstable();
        Ok(ok(lines.join("\n")))
    }
}
