//! The local stack as `make up` starts it (`scripts/up.sh`, `scripts/down.sh`), on its
//! default ports (50051–50055, Temporal 7233), in a state directory of the test's own.

use crate::mesh::bin_dir;
use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The ports the stack listens on.
pub const PORTS: [u16; 6] = [7233, 50051, 50052, 50053, 50054, 50055];

/// The checkout the scripts are in.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Fail, saying why, when something (a stack of the user's own) holds the stack's ports.
pub fn assert_ports_free() {
    for port in PORTS {
        let taken = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        assert!(
            !taken,
            "port {port} is in use (a local stack of your own? make down first)"
        );
    }
}

/// Nothing answers on the stack's ports any more.
pub fn assert_ports_closed() {
    for port in PORTS {
        let taken = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        assert!(!taken, "port {port} still answers after make down");
    }
}

/// `scripts/<script>` against the state directory `state`, with `env` (the model and
/// git keys of the test's own environment taken away first); its output. It must
/// succeed.
pub fn script(script: &str, state: &Path, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(root().join("scripts").join(script));
    cmd.env("FORKYARD_STATE_DIR", state)
        .env("FORKYARD_BIN_DIR", bin_dir())
        .envs(env.iter().copied());
    let out = without_keys(&mut cmd, env)
        .output()
        .expect("run the script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script}: {}: {text}", out.status);
    text
}

/// `cmd` without the keys the test's own environment may hold, but those of `keep`.
pub fn without_keys<'a>(cmd: &'a mut Command, keep: &[(&str, &str)]) -> &'a mut Command {
    const KEYS: [&str; 5] = [
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "GITHUB_TOKEN",
        "FORKYARD_GIT_CREDENTIALS",
        "FORKYARD_ALLOWED_GIT_HOSTS",
    ];
    for k in KEYS.iter().filter(|k| !keep.iter().any(|(n, _)| n == *k)) {
        cmd.env_remove(k);
    }
    cmd
}

/// The pid `make up` recorded for `service` (or `temporal`).
pub fn pid(state: &Path, service: &str) -> u32 {
    let file = state.join("pids").join(format!("{service}.pid"));
    std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A process's environment, as `/proc` shows it (`NAME=value`, NUL-separated).
pub fn environ(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap()).into_owned()
}

/// Stops the stack whatever the test did.
pub struct Down<'a>(pub &'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = Command::new(root().join("scripts/down.sh"))
            .env("FORKYARD_STATE_DIR", self.0)
            .output();
    }
}
