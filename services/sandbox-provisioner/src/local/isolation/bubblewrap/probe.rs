//! Bubblewrap tried at start-up: whether it runs a sandbox on this host, and with which
//! [`Features`] (a user namespace, where the host allows one).

use super::bwrap::{Features, Invocation};
use std::{path::Path, time::Duration};

/// Check that `bwrap` runs a sandbox on this host and find which features it has.
pub async fn probe(bwrap: &Path, scratch: &Path, uid: Option<u32>) -> Result<Features, String> {
    let argv = ["true".to_owned()];
    let mut last_err = String::new();
    for features in [Features { userns: true }, Features { userns: false }] {
        let inv = Invocation {
            bwrap,
            features,
            workspace: scratch,
            overlay: None,
            sandbox_id: "probe",
            relays: None,
            cgroup_joins: &[],
            argv: &argv,
            env: &[],
            seccomp: &[],
            tools: None,
            toolchains: &[],
            uid,
            image: None,
            init: false,
            file_size: None,
        };
        let mut cmd = inv
            .command()
            .map_err(|e| format!("cannot prepare {}: {e}", bwrap.display()))?;
        cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
        match tokio::time::timeout(Duration::from_secs(30), cmd.output()).await {
            Ok(Ok(out)) if out.status.success() => return Ok(features),
            Ok(Ok(out)) => {
                last_err = format!(
                    "{} ({})",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    out.status
                )
            }
            Ok(Err(e)) => return Err(format!("cannot run {}: {e}", bwrap.display())),
            Err(_) => last_err = "timed out".to_owned(),
        }
    }
    Err(format!(
        "{} cannot create a sandbox: {last_err}",
        bwrap.display()
    ))
}
