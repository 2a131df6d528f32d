//! Fork trees: what a branched fork's agent starts from. Its sandbox already holds the
//! parent's workspace at its end (a snapshot, see the gateway's `BranchFork`); here is
//! the rest of the branch point, per driver:
//! - `claude-code` keeps its home (`CLAUDE_CONFIG_DIR`) in the workspace's git directory,
//!   so the session file travels with the snapshot and never shows in the patch; a
//!   branch runs `claude -p <prompt> --resume <session> --fork-session`, continuing the
//!   parent's conversation under a new session id (the parent's stays as it was);
//! - `command` gets `FORKYARD_PARENT_FORK` and, when the runner holds the parent's
//!   transcript, a copy of it in the workspace's git directory, named by
//!   `FORKYARD_PARENT_TRANSCRIPT`.

use forkyard_proto::agent::v1::RunAgentRequest;
use std::collections::HashMap;

/// Claude Code's home in the sandbox: inside `.git`, so a snapshot of the workspace
/// carries its sessions and a patch never does.
pub const CLAUDE_HOME: &str = "/workspace/.git/forkyard/claude";

/// Where a branched `command` fork finds its parent's transcript (relative to the
/// workspace, as WriteFile takes it).
pub const PARENT_TRANSCRIPT: &str = ".git/forkyard-parent-transcript.jsonl";

/// The flags that continue the parent's session (empty for a fork that is no branch,
/// or whose parent printed no session id: it then starts a new conversation).
pub fn claude_resume_flags(req: &RunAgentRequest) -> String {
    match req.branch_of.as_ref().map(|b| b.session.as_str()) {
        Some(s) if is_session_id(s) => format!(" --resume {s} --fork-session"),
        _ => String::new(),
    }
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

/// The session id a stream-json line names (Claude Code prints it on its `system` init
/// line and its `result` line).
pub fn session_in(line: &str) -> Option<String> {
    if !line.contains("\"session_id\"") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    let id = v.get("session_id")?.as_str()?;
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
    fn the_session_id_is_read_from_claudes_stream_json() {
        let init = r#"{"type":"system","subtype":"init","session_id":"5e0c2a9e-1111-4c55-8e61-2f7a9b0c4d11","tools":[]}"#;
        assert_eq!(
            session_in(init).as_deref(),
            Some("5e0c2a9e-1111-4c55-8e61-2f7a9b0c4d11")
        );
        assert_eq!(session_in("plain output"), None);
        assert_eq!(session_in(r#"{"session_id":"$(reboot)"}"#), None);
    }
}
