//! The real agent CLIs in forks on images that bring them (and not the host's /usr):
//! Claude Code and Codex each edit through the LLM gateway and pay exactly their usage,
//! as in e2e_agent_clis, with nothing of the host's tools in sight.
//!
//! `make test` installs the CLIs (pinned, from npm); without them these tests fail.

#[path = "../../services/sandbox-provisioner/tests/common/test_image.rs"]
mod test_image;

mod agent_cli;

use agent_cli::{
    forks::{OnImage, run_cli_forks_on},
    model_mesh::{assert_cli_installed, cli_path, price_per_call},
};
use std::path::Path;

/// An image (`<dir>/<name>`) holding only the agent CLI's own executable (`exe`,
/// resolved, and linked from `link`), the shell and the few tools the scripted tool call
/// runs, with their libraries: nothing else of this host.
fn agent_image(dir: &Path, name: &str, exe: &str, link: &str) {
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|e| panic!("{exe}: {e}"));
    let exe = exe.to_str().unwrap();
    let tools = [
        "/bin/bash",
        "/usr/bin/env",
        "/usr/bin/sort",
        "/usr/bin/sed",
        "/usr/bin/grep",
    ];
    let programs: Vec<&str> = tools.iter().copied().chain([exe]).collect();
    test_image::save_image_of(dir, name, &programs, &[], &[(link, exe)]);
}

/// `<codex package>/node_modules/@openai/codex-linux-<arch>/vendor/<target>/bin/codex`.
fn codex_native() -> Option<String> {
    let wrapper = std::fs::canonicalize(cli_path("codex")?).ok()?;
    let scoped = wrapper.parent()?.parent()?.join("node_modules/@openai");
    std::fs::read_dir(scoped)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("codex-linux-"))
        .flat_map(|e| {
            std::fs::read_dir(e.path().join("vendor"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|target| target.path().join("bin/codex"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_in_forks_on_an_image_that_brings_it() {
    assert_cli_installed("claude");
    let archives = tempfile::tempdir().unwrap();
    let claude = cli_path("claude").unwrap();
    agent_image(
        archives.path(),
        "claude.tar",
        claude.to_str().unwrap(),
        "/usr/bin/claude",
    );
    run_cli_forks_on(
        "claude-code",
        "sonnet",
        "ANTHROPIC_API_KEY",
        price_per_call(3.0, 15.0, 0.3),
        "edited by claude on its image",
        Some(OnImage {
            archives: archives.path(),
            image: "archive:claude.tar",
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_in_forks_on_an_image_that_brings_it() {
    assert_cli_installed("codex");
    // Codex's native executable (what the npm wrapper starts, a static binary) as the
    // image's `codex`: the image needs no node.
    let native = codex_native().expect("codex's native executable in its npm package");
    let archives = tempfile::tempdir().unwrap();
    agent_image(archives.path(), "codex.tar", &native, "/usr/bin/codex");
    run_cli_forks_on(
        "codex",
        "gpt-5",
        "OPENAI_API_KEY",
        price_per_call(1.25, 10.0, 0.125),
        "edited by codex on its image",
        Some(OnImage {
            archives: archives.path(),
            image: "archive:codex.tar",
        }),
    )
    .await;
}
