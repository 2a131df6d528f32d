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

/// The script registers the dynamic completion, which calls the binary back at each TAB
/// (tests/daily.rs runs those calls).
#[test]
fn bash_completion_parses_and_calls_the_binary_back() {
    let script = completion("bash");
    assert!(
        script.contains("-F _clap_complete_forkyard forkyard"),
        "{script}"
    );
    assert!(script.contains("COMPLETE=\"bash\""), "{script}");
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
    assert!(completion("fish").contains("complete --keep-order --exclusive --command forkyard"));
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

/// `forkyard … | head`: the reader goes away before the CLI writes. The CLI ends quietly
/// with status 0, as gh and kubectl do, instead of panicking on the broken pipe.
#[test]
fn a_closed_standard_output_ends_the_cli_quietly_with_status_0() {
    for shell in ["bash", "zsh", "fish"] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_forkyard"))
            .args(["completion", shell])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The read end is closed before the CLI has even parsed its arguments.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{shell}: {:?} {stderr}", out.status);
        assert!(stderr.is_empty(), "{shell}: {stderr}");
    }
}
