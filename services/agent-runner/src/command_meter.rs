//! The command driver's meter: stdout cut into lines, each usage report priced, charged
//! and heartbeat, the CLI's total reconciled at the end, everything in the transcript.

use crate::{
    charge::{Charger, LEDGER_OUTAGE_GRACE, LedgerOutage},
    error::AgentError,
    llm_gateway::grants::Totals,
    models::Models,
    progress::ProgressSink,
    transcript::Transcript,
    usage::{self, Reported},
    usage_stream::{at_least, grown, is_zero},
    usage_sum::add,
};
use forkyard_proto::{
    agent::v1::{AgentProgress, RunAgentRequest},
    common::v1::Usage,
};
use serde_json::{Value, json};
use std::time::Instant;

/// Stdout kept for the output tail and a pretty-printed result at the end.
const KEEP_STDOUT_BYTES: usize = 256 << 10;
/// A line longer than this is not parsed (a usage event is far shorter).
const MAX_LINE_BYTES: usize = 4 << 20;
/// Output lines written to the transcript per attempt, in bytes.
const MAX_TRANSCRIPT_OUTPUT: usize = 8 << 20;

/// `p` (what earlier attempts and stdout reports came to) plus the gateway's requests.
pub(crate) fn add_totals(p: &mut AgentProgress, t: &Totals) {
    p.turns += t.requests;
    let mut usage = p.usage.unwrap_or_default();
    add(&mut usage, &t.usage);
    p.usage = Some(usage);
    p.cost_micros += t.cost_micros;
    p.charged_micros += t.charged_micros;
}

/// Bytes cut into lines as they arrive, with the last `KEEP_STDOUT_BYTES` kept.
#[derive(Default)]
pub struct Lines {
    partial: Vec<u8>,
    kept: Vec<u8>,
}

impl Lines {
    /// The complete lines in `chunk` (and before it).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        // Bytes, not text: a chunk may end inside a UTF-8 character.
        self.kept.extend_from_slice(chunk);
        if self.kept.len() > 2 * KEEP_STDOUT_BYTES {
            self.kept.drain(..self.kept.len() - KEEP_STDOUT_BYTES);
        }
        self.partial.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            out.push(String::from_utf8_lossy(&line[..i]).into_owned());
        }
        if self.partial.len() > MAX_LINE_BYTES {
            // Not a usage event: drop it rather than hold an endless line.
            self.partial.clear();
        }
        out
    }

    /// The last `KEEP_STDOUT_BYTES` or more of stdout.
    pub fn kept(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }

    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.partial);
        (!rest.is_empty()).then(|| String::from_utf8_lossy(&rest).into_owned())
    }
}

/// The state of one run of the command: progress, charges, transcript.
pub struct Meter<'a, S: ProgressSink> {
    pub req: &'a RunAgentRequest,
    pub models: &'a Models,
    pub spec_model: String,
    pub sink: &'a S,
    pub started: Instant,
    pub progress: AgentProgress,
    pub charger: Option<Charger>,
    pub transcript: Transcript,
    pub transcript_output: usize,
    /// What this attempt's own usage reports came to (a retried attempt runs the command
    /// afresh, so its reports start from zero).
    pub run_usage: Usage,
    pub run_priced: i64,
    pub total: Option<Reported>,
    /// Usage reports the ledger did not take ([`LedgerOutage`]).
    pub ledger_outage: LedgerOutage,
}

impl<S: ProgressSink> Meter<'_, S> {
    pub async fn beat(&mut self, action: &str) {
        self.beat_with(action, None).await;
    }

    /// A heartbeat showing `gateway`'s requests on top of the meter's own progress.
    pub async fn beat_with(&mut self, action: &str, gateway: Option<&Totals>) {
        self.progress.elapsed_ms = self.started.elapsed().as_millis() as u64;
        action.clone_into(&mut self.progress.last_action);
        let mut shown = self.progress.clone();
        if let Some(t) = gateway {
            add_totals(&mut shown, t);
        }
        self.sink.report(shown).await;
    }

    /// The gateway's totals `t` in the transcript.
    pub fn write_gateway_totals(&mut self, t: &Totals) {
        self.transcript.write(&json!({
            "type": "llm_gateway", "requests": t.requests, "usage": t.usage,
            "cost_micros": t.cost_micros, "charged_micros": t.charged_micros,
        }));
    }

    pub fn record_output(&mut self, line: &str) {
        if self.transcript_output > MAX_TRANSCRIPT_OUTPUT {
            return;
        }
        self.transcript_output += line.len();
        let entry = match serde_json::from_str::<Value>(line.trim()) {
            Ok(v) if v.is_object() => json!({"type": "output", "event": v}),
            _ => json!({"type": "output", "text": line}),
        };
        self.transcript.write(&entry);
        if self.transcript_output > MAX_TRANSCRIPT_OUTPUT {
            self.transcript
                .write(&json!({"type": "output_truncated", "after_bytes": MAX_TRANSCRIPT_OUTPUT}));
        }
    }

    /// Charge what `usage` costs as the next turn. Err: the ledger refused it.
    pub async fn turn(&mut self, usage: Usage, model: Option<String>) -> Result<(), AgentError> {
        // The model the CLI names when the table prices it, else the spec's.
        let model = model
            .filter(|m| self.models.knows(m))
            .unwrap_or_else(|| self.spec_model.clone());
        let cost = self.models.price(&model).cost_micros(&usage);
        self.progress.turns += 1;
        let n = self.progress.turns;
        let mut total = self.progress.usage.unwrap_or_default();
        add(&mut total, &usage);
        self.progress.usage = Some(total);
        add(&mut self.run_usage, &usage);
        self.progress.cost_micros += cost;
        self.run_priced += cost;
        self.transcript.write(&json!({
            "type": "usage", "turn": n, "model": model, "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens, "cache_read_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens, "cost_micros": cost,
        }));
        self.charge(&format!("turn-{n}"), n, cost).await?;
        self.beat(&format!("turn {n} charged")).await;
        Ok(())
    }

    async fn charge(&mut self, name: &str, n: u32, amount: i64) -> Result<(), AgentError> {
        let Some(charger) = self.charger.as_mut() else {
            return Ok(());
        };
        match charger.charge_as(name, n, amount).await {
            Ok(total) => {
                self.progress.charged_micros = self.progress.charged_micros.max(total);
                self.ledger_outage.answered();
                Ok(())
            }
            Err(AgentError::Ledger {
                retry: true,
                message,
            }) if self.ledger_outage.failed() < LEDGER_OUTAGE_GRACE => {
                // Not charged now; the commit posts the whole cost (`reconcile`).
                tracing::warn!(run_id = %self.req.run_id, fork = self.req.fork, turn = n, error = %message, "ledger away: usage not charged yet, the agent goes on");
                self.transcript.write(&json!({"type": "charge_deferred", "turn": n, "cost_micros": amount, "error": message}));
                Ok(())
            }
            Err(e) => {
                let (turns, charged) = (self.progress.turns, self.progress.charged_micros);
                self.transcript.write(&json!({"type": "end", "reason": "charge refused", "error": e.to_string(), "turns": turns}));
                tracing::warn!(run_id = %self.req.run_id, fork = self.req.fork, turn = n, error = %e, "charge refused, stopping the agent");
                self.beat("stopped: charge refused").await;
                Err(match e {
                    AgentError::BudgetExceeded(m) => AgentError::BudgetExceeded(format!(
                        "{m}; the agent's command was stopped after {} usage reports ({} micro-USD charged, {amount} refused)",
                        turns.saturating_sub(1),
                        charged
                    )),
                    other => other,
                })
            }
        }
    }

    /// At exit: this attempt's cost becomes the CLI's own total when it gave one (its
    /// price, else its total usage priced from the table), never less than what its usage
    /// reports were charged. The part not charged yet is not charged here: the result's
    /// `cost_micros` is the total, and the fork's Commit (whose amount includes what was
    /// charged) posts the rest under the account's overage policy, as it did before
    /// incremental charges. A total below the charges refunds nothing.
    pub fn reconcile(&mut self, kept_stdout: &str) {
        let total = self.total.take().or_else(|| {
            // A pretty-printed result object is not one line: read it from the end.
            (self.run_priced == 0 && is_zero(&self.run_usage))
                .then(|| usage::from_stdout(kept_stdout))
                .flatten()
        });
        let Some(total) = total else { return };
        let cost = total.cost_micros.unwrap_or_else(|| {
            self.models
                .price(&self.spec_model)
                .cost_micros(&total.usage)
        });
        let extra_usage = {
            let all = at_least(&total.usage, &self.run_usage);
            grown(&self.run_usage, &all)
        };
        let mut usage = self.progress.usage.unwrap_or_default();
        add(&mut usage, &extra_usage);
        self.progress.usage = Some(usage);
        self.run_usage = at_least(&total.usage, &self.run_usage);
        let rest = cost - self.run_priced;
        self.transcript.write(&json!({
            "type": "total", "reported_cost_micros": total.cost_micros, "cost_micros": cost,
            "charged_as_turns_micros": self.run_priced, "left_to_commit_micros": rest.max(0),
        }));
        if rest > 0 {
            self.progress.cost_micros += rest;
            self.run_priced += rest;
        } else if rest < 0 {
            tracing::info!(run_id = %self.req.run_id, fork = self.req.fork, reported = cost, charged = self.run_priced, "the cli's total is below what its usage reports were charged; keeping the charges");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    #[test]
    fn lines_span_chunks_and_characters_survive_a_split() {
        let mut l = Lines::default();
        let text = "{\"a\":1}\nnaïve\nrest".as_bytes();
        // Cut inside the two-byte "ï".
        let cut = text.iter().position(|b| *b == 0xc3).unwrap() + 1;
        assert_eq!(l.push(&text[..3]), Vec::<String>::new());
        assert_eq!(l.push(&text[3..cut]), vec!["{\"a\":1}".to_owned()]);
        assert_eq!(l.push(&text[cut..]), vec!["naïve".to_owned()]);
        assert_eq!(l.finish().as_deref(), Some("rest"));
        assert_eq!(l.kept(), "{\"a\":1}\nnaïve\nrest");
    }
}
