//! Extra replicas of a service beside the mesh's own (the replica and failover tests).

use crate::mesh::{Mesh, bin_dir, free_port};
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

impl Mesh {
    /// Start one more `sandbox-provisioner` replica beside the mesh's own: its own state
    /// dir (`<state>/<replica_id>`), gRPC and metrics ports and replica id, same Temporal.
    /// Its log is `<replica_id>.log`; it stops with the mesh. Returns its gRPC endpoint and
    /// state dir once it serves.
    pub async fn start_provisioner_replica(
        &mut self,
        replica_id: &str,
    ) -> anyhow::Result<(String, PathBuf)> {
        self.start_replica("sandbox-provisioner", replica_id, |cmd| {
            cmd.env("FORKYARD_PROVISIONER_REPLICA_ID", replica_id);
        })
        .await
    }

    /// Start one more `agent-runner` replica beside the mesh's own, wired like it (same
    /// Temporal, provisioner, ledger and extra environment) but with its own state dir
    /// (`<state>/<replica_id>`, so its artifact store holds only the transcripts of the
    /// agents it ran) and ports; it advertises `http://127.0.0.1:<port>`. Its log is
    /// `<replica_id>.log`; it stops with the mesh. Returns its gRPC endpoint and state dir
    /// once it serves.
    pub async fn start_agent_runner_replica(
        &mut self,
        replica_id: &str,
    ) -> anyhow::Result<(String, PathBuf)> {
        anyhow::ensure!(
            !self.options.tls,
            "agent-runner replicas: plaintext meshes only"
        );
        let provisioner = self.endpoint("sandbox-provisioner");
        let ledger = self.endpoint("budget-ledger");
        let extra = self.options.env.clone();
        let own: Vec<(String, String)> = self
            .options
            .service_env
            .iter()
            .filter(|(s, _, _)| s == "agent-runner")
            .map(|(_, k, v)| (k.clone(), v.clone()))
            .collect();
        self.start_replica("agent-runner", replica_id, |cmd| {
            cmd.env("FORKYARD_PROVISIONER_ADDR", provisioner)
                .env("FORKYARD_LEDGER_ADDR", ledger)
                .env("FORKYARD_HEARTBEAT_SECS", "1")
                .env("FORKYARD_LLM_LISTEN", format!("127.0.0.1:{}", free_port()))
                .envs(extra)
                .envs(own);
        })
        .await
    }

    /// Spawn `service` as the extra replica `replica_id` (own state dir and ports, same
    /// Temporal; `wire` adds its settings) and wait until it reports SERVING.
    async fn start_replica(
        &mut self,
        service: &str,
        replica_id: &str,
        wire: impl FnOnce(&mut Command),
    ) -> anyhow::Result<(String, PathBuf)> {
        let bin = bin_dir().join(service);
        anyhow::ensure!(bin.exists(), "{} missing", bin.display());
        let state = self.state.path().join(replica_id);
        std::fs::create_dir_all(&state)?;
        let port = free_port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(&bin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("TEMPORAL_ADDRESS", self.temporal_address())
            .env("TEMPORAL_NAMESPACE", "default")
            .env("FORKYARD_STATE_DIR", &state)
            .env("FORKYARD_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "FORKYARD_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .stdout(Stdio::null())
            .stderr(self.log_file(replica_id));
        wire(&mut cmd);
        let child = cmd.spawn()?;
        self.children.retain(|(n, _)| n != replica_id);
        self.children.push((replica_id.to_owned(), child));
        self.wait_replica_serving(replica_id, &endpoint).await?;
        Ok((endpoint, state))
    }

    /// Start one more `gateway` replica beside the mesh's own, set up exactly like it
    /// (same state dir, so the same API key file; same Temporal, ledger, runner and
    /// provisioner; the test's settings) on ports of its own. Its log is
    /// `<replica_id>.log`; it stops with the mesh. Returns its endpoint once it serves.
    pub async fn start_gateway_replica(&mut self, replica_id: &str) -> anyhow::Result<String> {
        let port = free_port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(bin_dir().join("gateway"));
        self.service_env("gateway", &mut cmd);
        cmd.envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .envs(
                self.options
                    .service_env
                    .iter()
                    .filter(|(s, _, _)| s == "gateway")
                    .map(|(_, k, v)| (k, v)),
            )
            .env("FORKYARD_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "FORKYARD_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .stdout(Stdio::null())
            .stderr(self.log_file(replica_id));
        let child = cmd.spawn()?;
        self.children.retain(|(n, _)| n != replica_id);
        self.children.push((replica_id.to_owned(), child));
        self.wait_replica_serving(replica_id, &endpoint).await?;
        Ok(endpoint)
    }

    /// Until replica `replica_id` at `endpoint` says SERVING (90 s at most; its exit or
    /// the deadline is an error with its log).
    async fn wait_replica_serving(
        &mut self,
        replica_id: &str,
        endpoint: &str,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some((_, child)) = self.children.iter_mut().find(|(n, _)| n == replica_id)
                && let Ok(Some(status)) = child.try_wait()
            {
                anyhow::bail!(
                    "{replica_id} exited with {status}; log:\n{}",
                    self.log_tail(replica_id)
                );
            }
            let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())?
                .connect_timeout(Duration::from_secs(2))
                .connect()
                .await;
            let serving = match channel {
                Ok(ch) => HealthClient::new(ch)
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32),
                Err(_) => false,
            };
            if serving {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{replica_id} not SERVING in time; log:\n{}",
                self.log_tail(replica_id)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
