//! A gateway in the test's process, answering from canned runs, for what the CLI does
//! with the gateway's answers (the mesh's e2e tests in tests/tests/e2e_cli*.rs drive
//! the real one). It records the bearer token of each call.

#![allow(dead_code)] // each test binary uses its part

use forkyard_proto::{
    common::v1::ForkResult,
    gateway::v1::{
        gateway_server::{Gateway, GatewayServer},
        *,
    },
};
use std::{
    collections::HashMap,
    pin::Pin,
    process::{Command, Output},
    sync::{Arc, Mutex},
};
use tonic::{Request, Response, Status};

#[derive(Default)]
pub struct Canned {
    pub runs: Vec<Run>,
    pub forks: HashMap<(String, u32), ForkResult>,
    /// What WatchRun sends; the stream then stays open until the client goes.
    pub events: Vec<RunEvent>,
    /// The `authorization` header of each call, "" when none.
    pub bearers: Vec<String>,
}

#[derive(Clone, Default)]
pub struct Fake(pub Arc<Mutex<Canned>>);

type Answer<T> = Result<Response<T>, Status>;

impl Fake {
    fn seen<T>(&self, req: &Request<T>) {
        let bearer = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        self.0.lock().unwrap().bearers.push(bearer);
    }

    fn run(&self, run_id: &str) -> Result<Run, Status> {
        let canned = self.0.lock().unwrap();
        let run = canned.runs.iter().find(|r| r.run_id == run_id);
        run.cloned()
            .ok_or_else(|| Status::not_found(format!("run {run_id} not found")))
    }

    /// Serve on a free loopback port: its endpoint.
    pub async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = GatewayServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    }
}

/// `forkyard args…` with `env` (and no config file of the machine's: FORKYARD_CONFIG is
/// set, to a file that need not exist, unless `env` sets it).
pub fn forkyard(args: &[&str], env: &[(&str, &str)], dir: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forkyard"));
    for var in [
        "FORKYARD_GATEWAY",
        "FORKYARD_API_KEY",
        "FORKYARD_CONTEXT",
        "FORKYARD_OUTPUT",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("FORKYARD_CONFIG", "/nonexistent/forkyard/config.toml")
        .args(args)
        .envs(env.iter().copied());
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    cmd.output().unwrap()
}

/// Its stdout, asserting the exit code.
pub fn ok(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tonic::async_trait]
impl Gateway for Fake {
    async fn launch_run(&self, req: Request<LaunchRunRequest>) -> Answer<LaunchRunResponse> {
        self.seen(&req);
        let prompt = req.into_inner().prompt;
        Ok(Response::new(LaunchRunResponse {
            run_id: format!("run-prompt-{}", prompt.len()),
            created: true,
        }))
    }

    async fn get_run(&self, req: Request<GetRunRequest>) -> Answer<Run> {
        self.seen(&req);
        self.run(&req.get_ref().run_id).map(Response::new)
    }

    type WatchRunStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<RunEvent, Status>> + Send>>;

    async fn watch_run(&self, req: Request<WatchRunRequest>) -> Answer<Self::WatchRunStream> {
        self.seen(&req);
        let events = self.0.lock().unwrap().events.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            for e in events {
                let _ = tx.send(Ok(e)).await;
            }
            // Open until the client hangs up: only the final event may end the watch.
            tx.closed().await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn list_runs(&self, req: Request<ListRunsRequest>) -> Answer<ListRunsResponse> {
        self.seen(&req);
        let canned = self.0.lock().unwrap();
        let runs = canned.runs.iter().map(|r| RunSummary {
            run_id: r.run_id.clone(),
            state: r.state,
            started_unix_ms: r.started_unix_ms,
            finished_unix_ms: r.finished_unix_ms,
            tenant: r
                .spec
                .as_ref()
                .map(|s| s.tenant.clone())
                .unwrap_or_default(),
        });
        Ok(Response::new(ListRunsResponse {
            runs: runs.collect(),
            next_page_token: String::new(),
        }))
    }

    async fn pause_run(&self, req: Request<PauseRunRequest>) -> Answer<Run> {
        self.seen(&req);
        self.run(&req.get_ref().run_id).map(Response::new)
    }

    async fn resume_run(&self, req: Request<ResumeRunRequest>) -> Answer<Run> {
        self.seen(&req);
        self.run(&req.get_ref().run_id).map(Response::new)
    }

    async fn cancel_run(&self, _: Request<CancelRunRequest>) -> Answer<CancelRunResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn cancel_fork(&self, _: Request<CancelForkRequest>) -> Answer<CancelForkResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn raise_budget(&self, _: Request<RaiseBudgetRequest>) -> Answer<RaiseBudgetResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn get_fork_result(&self, req: Request<GetForkResultRequest>) -> Answer<ForkResult> {
        self.seen(&req);
        let GetForkResultRequest { run_id, fork } = req.into_inner();
        let canned = self.0.lock().unwrap();
        canned
            .forks
            .get(&(run_id.clone(), fork))
            .cloned()
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("fork {fork} of {run_id} not found")))
    }

    async fn publish_fork(&self, _: Request<PublishForkRequest>) -> Answer<ForkResult> {
        Err(Status::unimplemented("fake"))
    }

    async fn branch_fork(
        &self,
        _: Request<forkyard_proto::gateway::v1::BranchForkRequest>,
    ) -> Answer<forkyard_proto::gateway::v1::BranchForkResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn start_cleanup(&self, _: Request<StartCleanupRequest>) -> Answer<StartCleanupResponse> {
        Err(Status::unimplemented("fake"))
    }

    async fn stop_cleanup(&self, _: Request<StopCleanupRequest>) -> Answer<StopCleanupResponse> {
        Err(Status::unimplemented("fake"))
    }
}
