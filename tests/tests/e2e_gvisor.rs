//! End to end, `isolation: gvisor` through the gateway as a user asks for it: the real
//! `claude` CLI (Claude Code) in every fork's sandbox on gVisor's user-space kernel (the
//! real `runsc`, Debian's package), reaching the scripted model server only through the
//! agent runner's metering LLM gateway. Checked as on bubblewrap (e2e_agent_clis): the
//! edit in each patch, verified in the sandbox — whose kernel the verify checks is
//! gVisor's — each model call metered once and paid exactly, no key where it must not
//! be. The sandbox-level suites (services/sandbox-provisioner/tests/gvisor*.rs) cover
//! exec, PTY, files, snapshots, limits and the escape suite under gVisor.
//!
//! Without `runsc` (`make test` installs it) the test records a skip, which fails under
//! `FORKYARD_TEST_STRICT`.

mod agent_cli;

use agent_cli::{
    forks::{Placement, run_cli_forks_placed},
    model_mesh::{assert_cli_installed, price_per_call},
};
use forkyard_common::testing::{Need, requires};

fn has_runsc() -> bool {
    let found = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    requires(Need::Installed("runsc"), found, "gVisor sandboxes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_forks_run_on_gvisor_through_the_gateway() {
    if !has_runsc() {
        return;
    }
    assert_cli_installed("claude");
    let place = Placement {
        on_image: None,
        isolation: "gvisor",
    };
    run_cli_forks_placed(
        "claude-code",
        "sonnet",
        "ANTHROPIC_API_KEY",
        price_per_call(3.0, 15.0, 0.3),
        "edited by claude on gvisor",
        place,
    )
    .await;
}
