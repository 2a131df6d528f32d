//! Fork trees: what a branched fork's agent starts from. Its sandbox already holds the
//! parent's workspace at its end (a snapshot, see the gateway's `BranchFork`); here is
//! the rest of the branch point, per driver:
//! - `claude-code` keeps its home (`CLAUDE_CONFIG_DIR`) in the workspace's git directory,
//!   so the session file travels with the snapshot and never shows in the patch; a
//!   branch runs `claude -p <prompt> --resume <session> --fork-session`, continuing the
//!   parent's conversation under a new session id (the parent's stays as it was);
//! - `codex` keeps its home (`CODEX_HOME`: sessions' rollout files, its state database)
//!   there too; a branch runs `codex exec fork <session> <prompt>`, the pinned CLI's
//!   (0.169) counterpart of Claude Code's `--fork-session`: the parent's thread copied
//!   under a new id, then the prompt as its next turn (`codex exec resume` would keep the
//!   parent's id, so every fork of a tree would report the same session);
//! - `command` gets `FORKYARD_PARENT_FORK` and, when the runner holds the parent's
//!   transcript, a copy of it in the workspace's git directory, named by
//!   `FORKYARD_PARENT_TRANSCRIPT`.

use forkyard_proto::agent::v1::RunAgentRequest;
use std::collections::HashMap;

/// Claude Code's home in the sandbox: inside `.git`, so a snapshot of the workspace
/// carries its sessions and a patch never does.
pub const CLAUDE_HOME: &str = "/workspace/.git/forkyard/claude";

/// Codex's home in the sandbox, for the same reason. Codex refuses a `CODEX_HOME` that
/// does not exist, so its program makes it first.
pub const CODEX_HOME: &str = "/workspace/.git/forkyard/codex";

/// Where a branched `command` fork finds its parent's transcript (relative to the
/// workspace, as WriteFile takes it).
pub const PARENT_TRANSCRIPT: &str = ".git/forkyard-parent-transcript.jsonl";

/// The agent CLI's home in the sandbox, where it writes its sessions; none for other
/// drivers.
pub fn home(req: &RunAgentRequest) -> Option<&'static str> {
    match forkyard_proto::Driver::parse(req.agent.as_ref().map_or("", |a| a.driver.as_str())) {
        Some(forkyard_proto::Driver::ClaudeCode) => Some(CLAUDE_HOME),
        Some(forkyard_proto::Driver::Codex) => Some(CODEX_HOME),
        _ => None,
    }
}

/// The flags that continue the parent's session (empty for a fork that is no branch,
/// or whose parent printed no session id: it then starts a new conversation).
pub fn claude_resume_flags(req: &RunAgentRequest) -> String {
    match parent_session(req) {
        Some(s) => format!(" --resume {s} --fork-session"),
        None => String::new(),
    }
}

/// The `codex exec` subcommand that continues the parent's session, and its session
/// argument (both empty for a fork that is no branch, or whose parent printed no
/// session id; the gateway refuses to branch such a parent).
pub fn codex_fork_args(req: &RunAgentRequest) -> (&'static str, String) {
    match parent_session(req) {
        Some(s) => (" fork", format!(" {s}")),
        None => ("", String::new()),
    }
}

/// The parent's session id, if this fork is a branch and it is one.
fn parent_session(req: &RunAgentRequest) -> Option<&str> {
    let s = req.branch_of.as_ref()?.session.as_str();
    is_session_id(s).then_some(s)
}

/// A session id is a UUID; anything else is never put on a command line.
fn is_session_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The variables a branched fork's command gets (none for a fork that is no branch).
pub fn env(req: &RunAgentRequest, transcript_copied: bool) -> HashMap<String, String> {
    let Some(b) = req.branch_of.as_ref() else {
        return HashMap::new();
    };
    let mut env = HashMap::from([("FORKYARD_PARENT_FORK".to_owned(), b.parent_fork.to_string())]);
    if !b.session.is_empty() {
        env.insert("FORKYARD_PARENT_SESSION".into(), b.session.clone());
    }
    if transcript_copied {
        env.insert(
            "FORKYARD_PARENT_TRANSCRIPT".into(),
            format!("/workspace/{PARENT_TRANSCRIPT}"),
        );
    }
    env
}

/// The session id a line of the CLI's JSON output names: Claude Code's stream-json has
/// it on its `system` init line and its `result` line, `codex exec --json` on its first
/// event, `{"type":"thread.started","thread_id":…}`.
pub fn session_in(line: &str) -> Option<String> {
    let key = if line.contains("\"session_id\"") {
        "session_id"
    } else if line.contains("\"thread.started\"") {
        "thread_id"
    } else {
        return None;
    };
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    if key == "thread_id" && v.get("type")?.as_str()? != "thread.started" {
        return None;
    }
    let id = v.get(key)?.as_str()?;
    is_session_id(id).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::agent::v1::BranchOf;

    fn branched(session: &str) -> RunAgentRequest {
        RunAgentRequest {
            branch_of: Some(BranchOf {
                parent_fork: 3,
                session: session.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_branch_resumes_its_parents_session_as_a_fork_of_it() {
        let id = "0b7f3c1e-9d2a-4c55-8e61-2f7a9b0c4d11";
        assert_eq!(
            claude_resume_flags(&branched(id)),
            format!(" --resume {id} --fork-session")
        );
        assert_eq!(claude_resume_flags(&RunAgentRequest::default()), "");
        // Never a shell word from elsewhere on the command line.
        assert_eq!(claude_resume_flags(&branched("x; rm -rf /")), "");
        assert_eq!(claude_resume_flags(&branched("")), "");
    }

    #[test]
    fn a_codex_branch_forks_its_parents_thread() {
        let id = "01a22a25-89af-7900-ba9a-ee556fd09337";
        assert_eq!(codex_fork_args(&branched(id)), (" fork", format!(" {id}")));
        assert_eq!(
            codex_fork_args(&RunAgentRequest::default()),
            ("", String::new())
        );
        assert_eq!(codex_fork_args(&branched("a b")), ("", String::new()));
    }

    #[test]
    fn a_branch_names_its_parent_in_the_environment() {
        let env = env(&branched(""), true);
        assert_eq!(env["FORKYARD_PARENT_FORK"], "3");
        assert_eq!(
            env["FORKYARD_PARENT_TRANSCRIPT"],
            "/workspace/.git/forkyard-parent-transcript.jsonl"
        );
        assert!(!env.contains_key("FORKYARD_PARENT_SESSION"));
        assert!(super::env(&RunAgentRequest::default(), false).is_empty());
    }

    #[test]
    fn the_session_id_is_read_from_claudes_stream_json_and_codexs_events() {
        let init = r#"{"type":"system","subtype":"init","session_id":"5e0c2a9e-1111-4c55-8e61-2f7a9b0c4d11","tools":[]}"#;
        assert_eq!(
            session_in(init).as_deref(),
            Some("5e0c2a9e-1111-4c55-8e61-2f7a9b0c4d11")
        );
        assert_eq!(session_in("plain output"), None);
        // `codex exec --json`'s first event.
        let started =
            r#"{"type":"thread.started","thread_id":"01a22a25-89af-7900-ba9a-ee556fd09337"}"#;
        assert_eq!(
            session_in(started).as_deref(),
            Some("01a22a25-89af-7900-ba9a-ee556fd09337")
        );
        let other = r#"{"type":"item.completed","thread_id":"01a22a25-89af-7900-ba9a-ee556fd09337","text":"thread.started"}"#;
        assert_eq!(session_in(other), None);
        assert_eq!(session_in(r#"{"session_id":"$(reboot)"}"#), None);
    }
}
