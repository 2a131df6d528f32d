//! The run's delivery step (`LaunchRunRequest.delivery`, `crate::activities::deliver`): once its
//! forks are done and ranked, the forks the delivery names are pushed (and their pull
//! requests opened) by one activity on the gateway's queue, and each fork's result
//! says where it went. It never fails the run: a fork whose push or pull request did
//! not happen says why in `ForkResult.delivered.error`.

use super::{options, run_state::SandboxOrchestrationWorkflow};
use crate::activities::deliver::{
    DeliverDone, DeliverFork, DeliverInput, DeliverLocal, text::RunFacts,
};
use forkyard_proto::{
    common::v1::{Delivered, ForkResult, ForkStatus, VerifyStatus},
    gateway::v1::{
        Delivery, Run,
        delivery::{PullRequests, Push},
    },
};
use temporalio_macros::{workflow, workflow_methods};
use temporalio_workflow::{WorkflowContext, WorkflowResult};

type Ctx = WorkflowContext<SandboxOrchestrationWorkflow>;

/// Deliver what the run's spec asks for, if anything.
pub(super) async fn deliver(ctx: &Ctx) {
    let (mut run, tenant) = ctx.state(|s| (s.snapshot(), s.spec.tenant.clone()));
    ctx.workflow_id().clone_into(&mut run.run_id);
    let Some(input) = input(&run, tenant) else {
        return;
    };
    let chosen: Vec<(u32, String)> = input
        .forks
        .iter()
        .map(|f| (f.fork, f.branch.clone()))
        .collect();
    let repo = input.repo.clone();
    let done = ctx
        .execute_activity(DeliverLocal::deliver, input, options::deliver())
        .await;
    let delivered: Vec<(u32, Delivered)> = match done {
        Ok(done) => done.forks,
        Err(e) => chosen
            .into_iter()
            .map(|(fork, branch)| {
                let error = format!("not delivered: {e}");
                (
                    fork,
                    Delivered {
                        remote: repo.clone(),
                        branch,
                        error,
                        ..Default::default()
                    },
                )
            })
            .collect(),
    };
    ctx.state_mut(|s| {
        for (fork, d) in delivered {
            s.record_delivered(fork, d);
        }
    });
}

/// The activity's input, or `None` when nothing is to be delivered.
fn input(run: &Run, tenant: String) -> Option<DeliverInput> {
    let spec = run.spec.as_ref()?;
    let d = spec.delivery.as_ref()?;
    let chosen = |f: &ForkResult| {
        let pushed = match d.push() {
            Push::Winner => f.fork == run.winner,
            Push::Succeeded => f.status == ForkStatus::Succeeded as i32,
            Push::Verified => {
                f.status == ForkStatus::Succeeded as i32 && f.verify == VerifyStatus::Passed as i32
            }
            Push::Unspecified | Push::None => false,
        };
        pushed.then(|| match d.pull_requests() {
            PullRequests::Winner => f.fork == run.winner,
            PullRequests::Each => true,
            PullRequests::Unspecified | PullRequests::None => false,
        })
    };
    let input = delivery_input(run, tenant, d, chosen);
    (!input.forks.is_empty()).then_some(input)
}

/// What delivers `d` for `run`: the forks `chosen` says (`Some(pull request wanted)`).
pub(crate) fn delivery_input(
    run: &Run,
    tenant: String,
    d: &Delivery,
    chosen: impl Fn(&ForkResult) -> Option<bool>,
) -> DeliverInput {
    let spec = run.spec.clone().unwrap_or_default();
    let prefix = if d.branch_prefix.is_empty() {
        &spec.branch
    } else {
        &d.branch_prefix
    };
    let forks = run
        .forks
        .iter()
        .filter_map(|f| {
            chosen(f).map(|pull_request| DeliverFork {
                fork: f.fork,
                branch: forkyard_proto::ids::fork_branch(prefix, f.fork),
                pull_request,
            })
        })
        .collect();
    let agent = spec.agent.clone().unwrap_or_default();
    DeliverInput {
        tenant,
        repo: spec.repo.clone(),
        remote: d.remote.clone(),
        base_branch: base_branch(&spec.base_ref),
        facts: RunFacts {
            run_id: run.run_id.clone(),
            prompt: spec.prompt.clone(),
            driver: agent.driver,
            model: agent.model,
            verify_command: spec.verify_command.clone(),
            winner: run.winner,
            ranking: run.ranking.clone(),
            forks: run.forks.clone(),
            cost_micros: run.cost_micros,
        },
        forks,
        draft: d.draft,
        commit_message: d.commit_message.clone(),
        author_name: d.author_name.clone(),
        author_email: d.author_email.clone(),
    }
}

/// The base ref when it names a branch; empty (the remote's default) for a commit id,
/// a tag or HEAD.
fn base_branch(base_ref: &str) -> String {
    let r = base_ref.strip_prefix("refs/heads/").unwrap_or(base_ref);
    let commit_like = r.len() >= 7 && r.bytes().all(|b| b.is_ascii_hexdigit());
    if r.is_empty() || r == "HEAD" || commit_like || r.starts_with("refs/") {
        String::new()
    } else {
        r.to_owned()
    }
}

/// A fork delivered after its run ended (`PublishFork`): one activity, in a workflow of
/// its own whose id (`<run id>/publish-<fork>`) makes it happen once.
#[workflow]
#[derive(Default)]
pub struct PublishWorkflow;

#[workflow_methods]
impl PublishWorkflow {
    #[run(name = "PublishWorkflow")]
    pub async fn run(
        ctx: &mut WorkflowContext<Self>,
        input: DeliverInput,
    ) -> WorkflowResult<DeliverDone> {
        Ok(ctx
            .execute_activity(DeliverLocal::deliver, input, options::deliver())
            .await?)
    }
}
