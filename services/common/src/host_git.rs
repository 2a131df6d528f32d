//! Host git for a repository a caller named: a predictable environment whatever the
//! host user's own. No prompts (a missing credential is an error, not a hang), no user
//! or system configuration, only the transports a repository may name (no `ext::` or
//! `fd::`), no proxy (it would resolve a checked host's name again), no hooks.
//! Credentials come only as `env` of the one process that uses them.

use crate::repo_location::PROXY_VARS;
use std::{process::Stdio, time::Duration};
use tokio::{io::AsyncWriteExt as _, process::Command};

/// `git <config> <args>` with that environment and `env` over it; killed when dropped.
pub fn command(config: &[String], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new("git");
    cmd.args(config)
        .args([
            "-c",
            "protocol.ext.allow=never",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ALLOW_PROTOCOL", "file:git:http:https:ssh")
        .env("GIT_SSH_COMMAND", crate::git_pin::SSH_COMMAND)
        .env("GIT_ASKPASS", "/bin/false")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for var in PROXY_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// Run `cmd` to its end within `timeout`, `input` on its stdin.
pub async fn output(
    mut cmd: Command,
    input: Option<&[u8]>,
    timeout: Duration,
) -> Result<std::process::Output, String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let run = async {
        let mut child = cmd.spawn().map_err(|e| format!("cannot run git: {e}"))?;
        let stdin = child.stdin.take();
        // Written beside the wait, so git's output never fills a pipe while its input
        // waits; git may stop reading early (a patch it refuses): its answer says why.
        let write = async {
            if let (Some(bytes), Some(mut stdin)) = (input, stdin) {
                let _ = stdin.write_all(bytes).await;
            }
        };
        let (_, out) = tokio::join!(write, child.wait_with_output());
        out.map_err(|e| format!("cannot run git: {e}"))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("git did not answer within {} s", timeout.as_secs()))?
}

/// The line of git's stderr that says why: its `fatal:` line (an `error:` before it,
/// such as the askpass that was refused, is a symptom), else the first.
pub fn reason(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut lines = stderr.lines().filter(|l| !l.trim().is_empty());
    let line = lines
        .clone()
        .find(|l| l.starts_with("fatal:"))
        .or_else(|| lines.next());
    line.unwrap_or("git failed and said nothing")
        .trim()
        .to_owned()
}
