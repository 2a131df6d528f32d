//! A trace as the sink received it, and what a run's trace must show: one tree under the
//! caller's span, each fork's steps under its fork, every gRPC call crossing services
//! client to server; a janitor's sweep a trace of its own.

use forkyard_tests::otlp::{SpanRecord, TraceSink};
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

/// The spans of the trace `trace_id` once `done` holds for them (spans arrive in
/// batches), or whatever came within 30 s.
pub async fn spans_once(
    sink: &TraceSink,
    trace_id: &str,
    done: impl Fn(&[SpanRecord]) -> bool,
) -> Vec<SpanRecord> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans: Vec<SpanRecord> = sink
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect();
        if done(&spans) || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Both forks' agent and destroy spans are in, and the ledger's and the patch's.
pub fn run_spans_in(spans: &[SpanRecord]) -> bool {
    let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
    count("RunActivity:agent.run") >= 2
        && count("forkyard.budget.v1.BudgetLedger/Charge") >= 4
        && count("git.patch") >= 2
        && count("forkyard.sandbox.v1.SandboxProvisioner/DestroySandbox") >= 4
        && count("RunWorkflow:SandboxOrchestrationWorkflow") >= 1
}

/// The span a fork's steps hang under: inline, the FinishFork span of the run's workflow;
/// otherwise the fork's own workflow.
pub fn fork_span_name(inline: bool) -> &'static str {
    if inline {
        "FinishFork"
    } else {
        "RunWorkflow:ForkWorkflow"
    }
}

/// One trace's spans, by id.
pub struct Trace<'a> {
    spans: &'a [SpanRecord],
    by_id: HashMap<&'a str, &'a SpanRecord>,
}

impl<'a> Trace<'a> {
    pub fn new(spans: &'a [SpanRecord]) -> Self {
        let by_id = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
        Self { spans, by_id }
    }

    /// Every span, one a line, for a failure's message.
    fn dump(&self) -> String {
        self.spans
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} <- {}",
                    s.service, s.name, s.span_id, s.parent_span_id
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The chain of span names from `span` up to the trace's root.
    pub fn ancestry(&self, span: &'a SpanRecord) -> Vec<&'a str> {
        let mut chain = vec![span.name.as_str()];
        let mut cur = span;
        while let Some(parent) = self.by_id.get(cur.parent_span_id.as_str()) {
            chain.push(parent.name.as_str());
            cur = parent;
        }
        chain
    }

    /// Whether `ancestor` is on `span`'s parent chain.
    fn descends_from(&self, span: &SpanRecord, ancestor: &SpanRecord) -> bool {
        let mut cur = span;
        while let Some(parent) = self.by_id.get(cur.parent_span_id.as_str()) {
            if parent.span_id == ancestor.span_id {
                return true;
            }
            cur = parent;
        }
        false
    }

    /// Four services take part in a run (the janitor only sweeps).
    pub fn assert_run_services_take_part(&self) {
        let services: HashSet<&str> = self.spans.iter().map(|s| s.service.as_str()).collect();
        for want in [
            "gateway",
            "sandbox-provisioner",
            "agent-runner",
            "budget-ledger",
        ] {
            assert!(
                services.contains(want),
                "no {want} span in the run's trace:\n{}",
                self.dump()
            );
        }
    }

    /// One tree: every span's parent is in the trace, except the LaunchRun server span,
    /// whose parent is the caller's span. Returns that root.
    pub fn assert_one_tree(&self, caller_span: &str) -> &'a SpanRecord {
        assert_eq!(self.by_id.len(), self.spans.len(), "span ids are unique");
        let roots: Vec<&SpanRecord> = self
            .spans
            .iter()
            .filter(|s| !self.by_id.contains_key(s.parent_span_id.as_str()))
            .collect();
        assert_eq!(roots.len(), 1, "one root:\n{}", self.dump());
        assert_eq!(roots[0].name, "forkyard.gateway.v1.Gateway/LaunchRun");
        assert_eq!(roots[0].parent_span_id, caller_span);
        assert_eq!(roots[0].service, "gateway");
        roots[0]
    }

    /// Each fork's steps hang under its fork workflow (inline: the run's workflow, with
    /// its last steps under a FinishFork span of its own), under the run's workflow,
    /// under LaunchRun; the agent span carries the fork's identity, tokens and cost.
    pub fn assert_fork_traced(&self, fork: u32, inline: bool, run_id: &str) {
        let fork_span = fork_span_name(inline);
        let fork_wf = self
            .spans
            .iter()
            .find(|s| s.name == fork_span && s.attr_str("forkyard.fork") == Some(fork.to_string()))
            .unwrap_or_else(|| panic!("no fork {fork} {fork_span} span:\n{}", self.dump()));
        assert_eq!(fork_wf.attr_str("forkyard.run_id"), Some(run_id.to_owned()));
        if !inline {
            assert_eq!(
                fork_wf.attr_str("forkyard.status").as_deref(),
                Some("succeeded")
            );
        }
        let chain = self.ancestry(fork_wf);
        assert!(
            chain.contains(&"RunWorkflow:SandboxOrchestrationWorkflow")
                && chain.last() == Some(&"forkyard.gateway.v1.Gateway/LaunchRun"),
            "fork {fork}: {chain:?}"
        );
        let agent = self.agent_span(fork, inline);
        assert_eq!(
            fork_wf.attr_str("forkyard.sandbox_id"),
            agent.attr_str("forkyard.sandbox_id"),
            "the fork's span names its sandbox"
        );
        let cost: f64 = agent
            .attr_str("forkyard.cost_usd")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (cost - (f64::from(fork) * 0.01 + 0.005)).abs() < 1e-9,
            "cost {cost}"
        );
        assert_eq!(
            agent.attr_str("forkyard.input_tokens").as_deref(),
            Some("100")
        );
        self.assert_charge_reaches_the_ledger(fork, agent);
        let sandbox = agent.attr_str("forkyard.sandbox_id").expect("sandbox id");
        self.assert_sandbox_steps(agent, &sandbox);
        self.assert_fork_prepared(fork, &sandbox);
    }

    /// The fork's agent activity, in the runner, under the run's workflow (inline) or
    /// the fork's.
    fn agent_span(&self, fork: u32, inline: bool) -> &'a SpanRecord {
        let agent_under = if inline {
            "RunWorkflow:SandboxOrchestrationWorkflow"
        } else {
            "RunWorkflow:ForkWorkflow"
        };
        let agent = self
            .spans
            .iter()
            .find(|s| {
                s.name == "RunActivity:agent.run"
                    && s.attr_str("forkyard.fork") == Some(fork.to_string())
            })
            .unwrap_or_else(|| panic!("no fork {fork} agent span:\n{}", self.dump()));
        assert_eq!(agent.service, "agent-runner");
        assert!(self.ancestry(agent).contains(&agent_under));
        agent
    }

    /// In-process steps join the trace through tracing-opentelemetry: the runner's
    /// charge of the fork's model turn (over every try), under the agent's activity,
    /// with its gRPC call to the ledger under it and the ledger's server span under that.
    fn assert_charge_reaches_the_ledger(&self, fork: u32, agent: &SpanRecord) {
        let charge = self
            .spans
            .iter()
            .find(|s| s.name == "ledger.charge" && self.descends_from(s, agent))
            .unwrap_or_else(|| {
                panic!(
                    "no ledger.charge under fork {fork}'s agent:\n{}",
                    self.dump()
                )
            });
        assert_eq!(charge.service, "agent-runner");
        assert_eq!(charge.attr_str("fork"), Some(fork.to_string()));
        assert_eq!(charge.attr_str("turn").as_deref(), Some("1"));
        // 100 input and 20 output tokens at $3 and $15 a million.
        assert_eq!(charge.attr_str("amount_micros").as_deref(), Some("600"));
        let ledger_server = self
            .spans
            .iter()
            .find(|s| {
                s.service == "budget-ledger"
                    && s.name == "forkyard.budget.v1.BudgetLedger/Charge"
                    && self.descends_from(s, charge)
            })
            .unwrap_or_else(|| {
                panic!(
                    "no ledger Charge under fork {fork}'s charge:\n{}",
                    self.dump()
                )
            });
        assert_eq!(
            self.by_id[ledger_server.parent_span_id.as_str()].service,
            "agent-runner",
            "the runner's client span is the ledger's parent"
        );
    }

    /// The provisioner's steps for this sandbox: each command it ran (the agent's
    /// included, named by its program only) and the patch's git step, each under the
    /// gRPC call that asked for it.
    fn assert_sandbox_steps(&self, agent: &SpanRecord, sandbox: &str) {
        let in_sandbox = |name: &str| -> Vec<&SpanRecord> {
            self.spans
                .iter()
                .filter(|s| {
                    s.service == "sandbox-provisioner"
                        && s.name == name
                        && s.attr_str("sandbox_id").as_deref() == Some(sandbox)
                })
                .collect()
        };
        let patch = in_sandbox("git.patch");
        assert_eq!(
            patch.len(),
            1,
            "one git.patch for {sandbox}:\n{}",
            self.dump()
        );
        let execs = in_sandbox("sandbox.exec");
        assert!(
            execs.iter().any(|e| self.descends_from(e, patch[0])),
            "the patch's command runs under git.patch:\n{}",
            self.dump()
        );
        assert!(
            execs.iter().any(|e| self.descends_from(e, agent)
                && e.attr_str("program").as_deref() == Some("sh")
                && e.attr_str("exit_code").as_deref() == Some("0")),
            "the agent's command is a sandbox.exec under its activity:\n{}",
            self.dump()
        );
    }

    /// The run prepares the fork: its reserve, create and health check are the fork's
    /// part of the wave's local activity in the gateway, under the run's workflow,
    /// calling the provisioner over gRPC.
    fn assert_fork_prepared(&self, fork: u32, sandbox: &str) {
        let create = self
            .spans
            .iter()
            .find(|s| {
                s.name == "PrepareFork"
                    && s.attr_str("forkyard.sandbox_id").as_deref() == Some(sandbox)
            })
            .unwrap_or_else(|| panic!("no PrepareFork span for {sandbox}:\n{}", self.dump()));
        assert_eq!(create.service, "gateway");
        assert_eq!(create.attr_str("forkyard.fork"), Some(fork.to_string()));
        assert!(
            self.ancestry(create)
                .contains(&"RunWorkflow:SandboxOrchestrationWorkflow")
        );
        // This fork's own calls, each under its own span: its reserve, its create and
        // its health check.
        for (service, method) in [
            ("budget-ledger", "forkyard.budget.v1.BudgetLedger/Reserve"),
            (
                "sandbox-provisioner",
                "forkyard.sandbox.v1.SandboxProvisioner/CreateSandbox",
            ),
            (
                "sandbox-provisioner",
                "forkyard.sandbox.v1.SandboxProvisioner/HealthCheck",
            ),
        ] {
            let under_fork = self
                .spans
                .iter()
                .filter(|s| s.service == service && s.name == method)
                .filter(|s| self.descends_from(s, create))
                .count();
            assert_eq!(
                under_fork,
                1,
                "{method} under fork {fork}'s PrepareFork:\n{}",
                self.dump()
            );
        }
    }

    /// The ledger's part hangs under a fork: its activities, or (when the gateway makes
    /// the ledger calls as local activities over gRPC) its gRPC server spans.
    pub fn assert_ledger_under_a_fork(&self, fork_span: &str) {
        assert!(
            self.spans
                .iter()
                .any(|s| s.service == "budget-ledger" && self.ancestry(s).contains(&fork_span)),
            "no ledger span under a fork:\n{}",
            self.dump()
        );
    }

    /// Every gRPC server span (but the `root`) is the child of the caller's client span
    /// for the same method, in another service (context through gRPC metadata); the
    /// provisioner has some (the agent runner's calls into the sandbox). And no span
    /// failed.
    pub fn assert_servers_under_their_clients(&self, root: &SpanRecord) {
        let servers: Vec<&SpanRecord> = self
            .spans
            .iter()
            .filter(|s| s.name.starts_with("forkyard.") && s.name != root.name)
            .filter(|s| self.by_id[s.parent_span_id.as_str()].service != s.service)
            .collect();
        assert!(
            servers.iter().any(|s| s.service == "sandbox-provisioner"),
            "no provisioner gRPC server span:\n{}",
            self.dump()
        );
        for server in &servers {
            let parent = self.by_id[server.parent_span_id.as_str()];
            assert_eq!(
                parent.name, server.name,
                "client and server span name the method"
            );
        }
        assert!(
            self.spans.iter().all(|s| s.status_code != 2),
            "no span failed in a clean run:\n{}",
            self.dump()
        );
    }
}

/// A sweep's trace: the provisioner's and the ledger's spans hang under the janitor's
/// SweepNow.
pub fn assert_sweep_spans_under_sweep_now(sweep_spans: &[SpanRecord]) {
    let trace = Trace::new(sweep_spans);
    for service in ["sandbox-provisioner", "budget-ledger"] {
        let server = sweep_spans
            .iter()
            .find(|s| s.service == service)
            .unwrap_or_else(|| panic!("no {service} span in the sweep's trace: {sweep_spans:#?}"));
        let chain = trace.ancestry(server);
        assert_eq!(
            chain.last(),
            Some(&"forkyard.janitor.v1.Janitor/SweepNow"),
            "{service}: {chain:?}"
        );
    }
}
