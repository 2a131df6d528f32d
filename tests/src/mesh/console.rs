//! The console (services/console) in front of a mesh's gateway: an HTTP service, so it
//! is started on demand rather than among the gRPC `SERVICES`.

use super::{Mesh, free_port, programs::bin_dir};
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

impl Mesh {
    /// Start the console against this mesh's gateway; its base URL once it answers.
    pub async fn start_console(&mut self) -> anyhow::Result<String> {
        let bin = bin_dir().join("console");
        anyhow::ensure!(
            bin.exists(),
            "{} missing: build the services first (`cargo build --workspace --bins`)",
            bin.display()
        );
        let port = free_port();
        let child = Command::new(&bin)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("FORKYARD_CONSOLE_LISTEN", format!("127.0.0.1:{port}"))
            .env("FORKYARD_GATEWAY", self.endpoint("gateway"))
            .stdout(Stdio::null())
            .stderr(self.log_file("console"))
            .spawn()?;
        self.children.retain(|(n, _)| n != "console");
        self.children.push(("console".into(), child));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(format!("{url}/healthz")).await
                && r.status().is_success()
            {
                return Ok(url);
            }
            if let Some(status) = self.wait_exit("console", Duration::ZERO) {
                anyhow::bail!(
                    "console exited with {status}; log:\n{}",
                    self.log_tail("console")
                );
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "console did not answer in time; log:\n{}",
                self.log_tail("console")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
