//! The endpoint a replica advertises for what only it holds: the provisioner's sandboxes
//! (`Sandbox.owner_endpoint`), the agent runner's transcripts (`transcript_endpoint`).
//! Callers then ask that replica, not whichever one a load-balanced address picks.

use std::net::SocketAddr;

/// `given` when set (it must be an http(s) URL); else `http://<listen>`, with this host's
/// name in place of an unspecified listen address (0.0.0.0 / ::), which no peer can dial.
/// `flag` names the setting in errors, e.g. `--advertise-addr (FORKYARD_…)`.
pub fn resolve(flag: &str, given: Option<&str>, listen: SocketAddr) -> Result<String, String> {
    match given.map(str::trim) {
        Some("") => Err(format!("{flag} is empty")),
        Some(url) => {
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || tonic::transport::Endpoint::from_shared(url.to_owned()).is_err()
            {
                return Err(format!("{flag} {url:?} is not an http:// or https:// URL"));
            }
            Ok(url.trim_end_matches('/').to_owned())
        }
        None if listen.ip().is_unspecified() => {
            Ok(format!("http://{}:{}", hostname(), listen.port()))
        }
        None => Ok(format!("http://{listen}")),
    }
}

/// This host's name (a pod's name in Kubernetes), `localhost` when unknown.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: &str = "--advertise-addr (FORKYARD_AGENT_RUNNER_ADVERTISE_ADDR)";

    #[test]
    fn defaults_to_the_listen_address_or_the_host_name() {
        let local: SocketAddr = "127.0.0.1:50053".parse().unwrap();
        assert_eq!(
            resolve(FLAG, None, local).unwrap(),
            "http://127.0.0.1:50053"
        );
        let any: SocketAddr = "0.0.0.0:50053".parse().unwrap();
        let url = resolve(FLAG, None, any).unwrap();
        assert!(
            url.starts_with("http://") && url.ends_with(":50053"),
            "{url}"
        );
        assert!(!url.contains("0.0.0.0"), "{url}");
        assert_eq!(
            resolve(FLAG, Some("http://10.1.2.3:50053/"), any).unwrap(),
            "http://10.1.2.3:50053"
        );
        for bad in ["", "  ", "10.1.2.3:50053", "ftp://x:1"] {
            let e = resolve(FLAG, Some(bad), any).unwrap_err();
            assert!(e.contains("FORKYARD_AGENT_RUNNER_ADVERTISE_ADDR"), "{e}");
        }
    }
}
