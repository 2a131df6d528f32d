//! `forkyard completion <shell>` prints a script the shell accepts, without a gateway.

use std::process::Command;

fn completion(shell: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_forkyard"))
        .args(["completion", shell])
        // Nothing listens here: the command must not need the gateway.
        .env("FORKYARD_GATEWAY", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bash_completion_parses_and_completes_the_subcommands() {
    let script = completion("bash");
    assert!(script.contains("complete -F _forkyard"), "{script}");
    for sub in ["fork", "watch", "result", "keys", "completion"] {
        assert!(script.contains(sub), "{sub} missing");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forkyard.bash");
    std::fs::write(&path, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn zsh_and_fish_completions_are_printed() {
    assert!(completion("zsh").starts_with("#compdef forkyard"));
    assert!(completion("fish").contains("complete -c forkyard"));
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_forkyard"))
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcsh"));
}
