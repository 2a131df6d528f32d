//! What the run loop does with forks that finished: record them, finish inline forks
//! together, and keep the run's search attributes in step.

use super::Flight;
use crate::workflows::{
    LABELS_ATTR, RUN_STATE_ATTR,
    inline::{self, AgentDone},
    start::{ChildOutcome, give_back, run_child},
};

impl Flight<'_> {
    /// Record the forks that finished; inline forks whose agent ended in this activation
    /// finish together, in the order their completions came (see `inline`).
    pub(super) async fn take_finished(&mut self, finished: Vec<(u32, ChildOutcome)>) {
        let ctx = self.ctx;
        let mut batch = Vec::new();
        for (fork, outcome) in finished {
            let result = match outcome {
                ChildOutcome::Finished(result) => *result,
                ChildOutcome::AgentDone(done) => {
                    batch.push(*done);
                    continue;
                }
                ChildOutcome::NotStarted(not) => give_back(ctx, *not).await,
            };
            self.tokens.remove(&fork);
            ctx.state_mut(|s| s.record(fork, result));
        }
        if !batch.is_empty() {
            self.finish_inline(batch).await;
        }
    }

    /// Patch, settle and destroy a batch of inline forks; a fork whose patch is too
    /// large for the run's history goes on in a child.
    async fn finish_inline(&mut self, batch: Vec<AgentDone>) {
        let ctx = self.ctx;
        ctx.state_mut(|s| {
            for d in &batch {
                s.set_fork_phase(d.f.input.fork, d.finishing_phase());
            }
        });
        let patches = ctx.state(|s| s.patches);
        for outcome in inline::finish(ctx, batch, patches).await {
            match outcome {
                inline::Outcome::Done(fork, result) => {
                    self.tokens.remove(&fork);
                    // As the fork workflows' interceptor does for theirs.
                    if !ctx.is_replaying() {
                        let model = self.spec.agent.as_ref().map_or("", |a| a.model.as_str());
                        crate::fork_metrics::record(&result, model);
                    }
                    ctx.state_mut(|s| {
                        s.full.insert(fork, (*result).clone());
                        s.record(fork, *result);
                    });
                }
                inline::Outcome::HandOff(h) => {
                    let (f, prepared, input) = *h;
                    self.in_flight.push(run_child(ctx, f, prepared, input));
                }
            }
        }
    }

    /// Keep the `ForkyardRunState` search attribute in step, so ListRuns can filter on it.
    pub(super) fn publish_state(&mut self) {
        let ctx = self.ctx;
        let state = ctx.state(|s| s.live_state()).as_str_name().to_owned();
        if self.published == state {
            return;
        }
        let labels = ctx.state(|s| {
            let mut l: Vec<String> = s
                .spec
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            l.sort();
            l
        });
        let mut updates = vec![RUN_STATE_ATTR.value_set(state.clone())];
        if self.published.is_empty() {
            updates.push(LABELS_ATTR.value_set(labels));
        }
        ctx.upsert_search_attributes(updates);
        self.published = state;
    }
}
