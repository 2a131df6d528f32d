//! The response's output tail: the end of the command's stdout, then of its stderr, cut
//! to what the caller allows.

use forkyard_common::text::tail;
use forkyard_proto::agent::v1::RunAgentRequest;

const OUTPUT_TAIL_BYTES: usize = 4096;

/// The most bytes of a response's `output_tail` the caller allows (`output_tail_bytes`;
/// its stdout and stderr parts half each): 8 KiB unless it asked for less, at least 512.
pub(crate) fn tail_bytes(req: &RunAgentRequest) -> usize {
    match usize::try_from(req.output_tail_bytes) {
        Ok(n @ 1..) => n.clamp(512, 2 * OUTPUT_TAIL_BYTES),
        _ => 2 * OUTPUT_TAIL_BYTES,
    }
}

/// The command's stderr as it arrives, only its end kept.
#[derive(Default)]
pub(super) struct Stderr(String);

impl Stderr {
    pub(super) fn push(&mut self, chunk: &[u8]) {
        let stderr = &mut self.0;
        stderr.push_str(&String::from_utf8_lossy(chunk));
        if stderr.len() > 2 * OUTPUT_TAIL_BYTES {
            *stderr = tail(stderr, OUTPUT_TAIL_BYTES).to_owned();
        }
    }
}

/// What the response shows of the command's output: the end of its stdout (`kept`),
/// then of its stderr, each at most half of what the caller allows.
pub(super) fn output_tail(req: &RunAgentRequest, kept: &str, stderr: &Stderr) -> String {
    let half = tail_bytes(req) / 2;
    let mut output_tail = tail(kept, half).to_owned();
    if !stderr.0.is_empty() {
        output_tail.push_str("\n--- stderr ---\n");
        output_tail.push_str(tail(&stderr.0, half));
    }
    output_tail
}
