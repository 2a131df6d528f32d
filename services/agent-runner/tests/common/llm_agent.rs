//! What the LLM-driver tests share: an agent's request, an Anthropic run, the model
//! replies they script, and a file read back from the sandbox.

use super::{Beats, Fixture};
use forkyard_agent_runner::error::AgentError;
use forkyard_proto::{
    agent::v1::{RunAgentRequest, RunAgentResponse},
    common::v1::AgentSpec,
    sandbox::v1::ReadFileRequest,
};
use serde_json::{Value, json};

pub fn request(
    f: &Fixture,
    run_id: &str,
    driver: &str,
    model: &str,
    reservation: &str,
) -> RunAgentRequest {
    RunAgentRequest {
        run_id: run_id.into(),
        fork: 1,
        sandbox_id: f.sandbox_id.clone(),
        agent: Some(AgentSpec {
            driver: driver.into(),
            model: model.into(),
            ..Default::default()
        }),
        prompt: "Say hi instead of hello in README.md".into(),
        timeout_secs: 120,
        reservation_id: reservation.into(),
        charge_key: format!("{run_id}/fork-1/a1/agent"),
        attempt: 1,
        ..Default::default()
    }
}

/// Run the Anthropic driver (sonnet) for fork 1 of `run` on `reservation`, as attempt 1:
/// what it returned and the heartbeats it sent.
pub async fn run_anthropic(
    f: &Fixture,
    run: &str,
    reservation: &str,
) -> (Result<RunAgentResponse, AgentError>, Beats) {
    let beats = Beats::default();
    let out = f
        .runner
        .run(
            &request(f, run, "anthropic", "sonnet", reservation),
            &beats,
            std::future::pending(),
            None,
            1,
        )
        .await;
    (out, beats)
}

pub fn tool_use(id: &str, name: &str, input: Value, usage: Value) -> (u16, Value) {
    (
        200,
        json!({"id": format!("msg_{id}"), "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "Let me do that."},
                    {"type": "tool_use", "id": id, "name": name, "input": input}],
        "usage": usage}),
    )
}

pub fn end_turn(text: &str, usage: Value) -> (u16, Value) {
    (
        200,
        json!({"id": "msg_end", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "stop_reason": "end_turn",
        "content": [{"type": "text", "text": text}], "usage": usage}),
    )
}

pub async fn read(f: &mut Fixture, path: &str) -> String {
    let r = f
        .provisioner
        .read_file(ReadFileRequest {
            sandbox_id: f.sandbox_id.clone(),
            path: path.into(),
            max_bytes: 0,
        })
        .await
        .unwrap()
        .into_inner();
    String::from_utf8(r.content).unwrap()
}
