//! Where the real keys must not be: in the sandbox (its environment, files and
//! processes, as the scripted tool call reports them in the patch), the services' logs,
//! a fork's transcript or output, or the run's Temporal history.

use super::model_mesh::{ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX};
use forkyard_proto::common::v1::ForkResult;
use forkyard_tests::{
    Mesh,
    leaks::{History, history, log_files},
};

/// What the scripted tool call runs inside the sandbox: the edit, then evidence of what
/// the sandbox holds (its environment, and every file and process that mentions the real
/// keys), all into the workspace so it comes back in the patch. The key patterns are
/// built at run time so the command's own text (in the CLI's session log) never matches;
/// the fork's token is masked (a dead token, but still no secret for the patch).
pub fn edit_and_scan(line: &str) -> String {
    format!(
        "printf '{line}\\n' >> notes.txt; t=$(printf 'fyk-%s' llm-); env | sort | sed -E \"s/$t[0-9a-f]{{64}}/[fork token]/\" > .sandbox-env.txt; \
         p1=$(printf 'sk-ant-api03-%s' e2eREALKEY); p2=$(printf 'sk-proj-%s' e2eREALKEY); \
         {{ grep -rIl -e \"$p1\" -e \"$p2\" /workspace /tmp /etc /run 2>/dev/null; \
            for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -l -e \"$p1\" -e \"$p2\" \"$f\" 2>/dev/null; done; }} \
         > .key-scan.txt; true"
    )
}

/// The key and the fork tokens are in no log, transcript or Temporal payload of the run.
pub async fn assert_no_secret_leaked(mesh: &Mesh, run_id: &str, forks: &[ForkResult]) {
    assert_no_secret_in_logs_or_forks(mesh, forks);
    assert_no_secret_in_history(mesh, run_id);
}

fn assert_no_secret_in_logs_or_forks(mesh: &Mesh, forks: &[ForkResult]) {
    let logs = log_files(mesh.state_dir());
    // The services' own logs (`<state>/logs/`) were read, the agent runner's among them:
    // a check that reads nothing cannot fail.
    assert!(
        logs.iter().any(|p| p.ends_with("logs/agent-runner.log")),
        "the agent runner's log was not read (read: {logs:?})"
    );
    let mut bytes = 0;
    for path in &logs {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
        bytes += text.len();
        for secret in [ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX] {
            assert!(!text.contains(secret), "{secret} in {}", path.display());
        }
    }
    assert!(bytes > 0, "every log read was empty: {logs:?}");
    for f in forks {
        for secret in [ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX] {
            assert!(
                !f.transcript.contains(secret),
                "{secret} in fork {} transcript",
                f.fork
            );
            assert!(
                !f.agent_output_tail.contains(secret),
                "{secret} in fork {} output",
                f.fork
            );
        }
    }
}

/// Every payload of the run's history read, decoded, and the history as it is.
fn assert_no_secret_in_history(mesh: &Mesh, run_id: &str) {
    let History { raw, decoded } = history(mesh, run_id);
    assert!(
        decoded.contains("Add a line to notes.txt") && decoded.contains("llm_gateway"),
        "the run's payloads were not read"
    );
    for secret in [ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX] {
        assert!(
            !decoded.contains(secret),
            "{secret} in a Temporal payload of {run_id}"
        );
        assert!(
            !raw.contains(secret),
            "{secret} in the Temporal history of {run_id}"
        );
    }
}

/// What the sandbox saw, from the files the scripted command wrote into the patch.
pub fn assert_sandbox_held_only_the_token(fork: &ForkResult, key_var: &str) {
    let added = |file: &str| -> String {
        let start = fork
            .patch
            .find(&format!("+++ b/{file}"))
            .unwrap_or_else(|| panic!("{file} not in the patch:\n{}", fork.patch));
        fork.patch[start..]
            .lines()
            .skip(2)
            .take_while(|l| !l.starts_with("diff --git"))
            .filter_map(|l| l.strip_prefix('+'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let env = added(".sandbox-env.txt");
    assert!(
        env.lines().any(|l| l == format!("{key_var}=[fork token]")),
        "{key_var} is not the fork token:\n{env}"
    );
    assert!(
        !env.contains("e2eREALKEY"),
        "a real key in the sandbox environment:\n{env}"
    );
    assert!(
        env.contains("FORKYARD_LLM_URL=http://127.0.0.1:4000"),
        "{env}"
    );
    // The scan file is empty: no file or process in the sandbox mentions a real key.
    assert!(
        !fork.patch.contains("+++ b/.key-scan.txt"),
        "the sandbox holds a real key: {}",
        added(".key-scan.txt")
    );
    assert!(
        fork.patch.contains(".key-scan.txt"),
        "the scan never ran:\n{}",
        fork.patch
    );
}
