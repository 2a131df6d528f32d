//! Fork trees (#45) with the real agent CLIs through the whole mesh, one mesh and one
//! scripted model for both (Claude Code speaks Messages to it, Codex Responses, so each
//! tree's calls are told apart by their API), the two trees at once:
//! - `claude-code`: a fork edits notes.txt (the scripted model's tool call); branching it
//!   into three with a new prompt gives three forks whose Claude Code resumes the
//!   parent's session (its home travels with the workspace's snapshot): their first model
//!   request carries the parent's turns, the parent's tool result among them, then the
//!   new prompt as the last user turn. Continuing one of them (a branch of a branch)
//!   resumes that child's own session, not its parent's or a sibling's.
//! - `codex`: the same edit; branching it into two gives two forks whose `codex exec
//!   fork` continues the parent's thread: their first Responses request carries the
//!   parent's items, its tool call and output among them, then the new prompt; continuing
//!   one of them resumes that child's own thread.
//!
//! - the built-in `anthropic` and `openai` drivers (their own tool-use loop in the
//!   runner, keeping its conversation in the workspace's .git at the agent's end): the
//!   same edit, two branches of it whose first request carries the parent's turns, and a
//!   continued branch that goes on from that branch's own conversation.
//!
//! - a running fork branched at its last completed model turn
//!   (`fork_trees_clis::running`): `claude-code`'s and `codex`'s next model request held at the
//!   runner's LLM gateway while its workspace is snapshotted, the built-in loops'
//!   conversation kept and snapshotted before they ask again; the parent goes on to its
//!   end, the two branches start from that turn's workspace and conversation.
//!
//! Either way the scripted model answers a follow-up without the parent's tool result
//! with 400; each child's patch holds the parent's edit and its own; each is charged for
//! its own model calls only, as the parent was for its; the ledger holds the tree's
//! costs. The refusal of a parent without a session is a unit test of the gateway's
//! BranchFork check (`api::branch`).
//!
//! `make test` installs the CLIs (pinned, from npm); without them the CLIs' test fails.

mod agent_cli;
mod fork_trees_clis;

use agent_cli::model_mesh::{assert_cli_installed, options, price_per_call};
use forkyard_tests::{Mesh, scripted_model::ScriptedModel};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_and_codex_forks_branch_into_continuations_of_their_conversations() {
    assert_cli_installed("claude");
    assert_cli_installed("codex");
    let model = ScriptedModel::start(fork_trees_clis::script()).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    tokio::join!(
        fork_trees_clis::claude::tree(&mesh, &model),
        fork_trees_clis::two_branches(
            &mesh,
            &model,
            ("codex", "gpt-5"),
            "/v1/responses",
            price_per_call(1.25, 10.0, 0.125),
            fork_trees_clis::codex::assert_first_requests_continue_the_parent,
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_and_openai_forks_branch_into_continuations_of_their_conversations() {
    let model = ScriptedModel::start(fork_trees_clis::script()).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    tokio::join!(
        fork_trees_clis::two_branches(
            &mesh,
            &model,
            ("anthropic", "claude-sonnet-4-5"),
            "/v1/messages",
            price_per_call(3.0, 15.0, 0.3),
            fork_trees_clis::builtin::assert_first_requests_continue_the_parent,
        ),
        fork_trees_clis::two_branches(
            &mesh,
            &model,
            ("openai", "gpt-5"),
            "/v1/chat/completions",
            price_per_call(1.25, 10.0, 0.125),
            fork_trees_clis::builtin::assert_first_requests_continue_the_parent,
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_claude_code_and_codex_forks_branch_at_their_last_completed_turn() {
    assert_cli_installed("claude");
    assert_cli_installed("codex");
    let model = ScriptedModel::start(fork_trees_clis::running::script()).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    tokio::join!(
        fork_trees_clis::running::branch_mid_run(
            &mesh,
            &model,
            ("claude-code", "sonnet"),
            "/v1/messages",
            price_per_call(3.0, 15.0, 0.3),
        ),
        fork_trees_clis::running::branch_mid_run(
            &mesh,
            &model,
            ("codex", "gpt-5"),
            "/v1/responses",
            price_per_call(1.25, 10.0, 0.125),
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_anthropic_and_openai_forks_branch_at_their_last_completed_turn() {
    let model = ScriptedModel::start(fork_trees_clis::running::script()).await;
    let mesh = Mesh::start_with(options(&model)).await.expect("mesh");
    tokio::join!(
        fork_trees_clis::running::branch_mid_run(
            &mesh,
            &model,
            ("anthropic", "claude-sonnet-4-5"),
            "/v1/messages",
            price_per_call(3.0, 15.0, 0.3),
        ),
        fork_trees_clis::running::branch_mid_run(
            &mesh,
            &model,
            ("openai", "gpt-5"),
            "/v1/chat/completions",
            price_per_call(1.25, 10.0, 0.125),
        ),
    );
}
