//! The LLM gateway's public side, for sandboxes off the mesh's hosts (E2B): no relay of
//! a provisioner reaches into them, so they dial the gateway themselves, at a URL the
//! operator makes reachable from the sandbox provider (docs/llm-gateway.md, "Sandboxes
//! off the mesh's hosts").
//!
//! Two settings, both or neither: where this replica listens for them
//! (`--llm-public-listen`, plain HTTP meant to sit behind the operator's TLS ingress),
//! and the URL sandboxes are given for it (`--public-llm-gateway-url`). Requests there
//! carry no sandbox header: the fork's token alone is the credential, and only tokens
//! minted for remote sandboxes are taken there.

use std::net::SocketAddr;
use tokio::net::TcpListener;

const LISTEN_SETTING: &str = "--llm-public-listen (FORKYARD_LLM_PUBLIC_LISTEN)";
const URL_SETTING: &str = "--public-llm-gateway-url (FORKYARD_PUBLIC_LLM_GATEWAY_URL)";

#[derive(Debug, Clone, Default, clap::Args)]
pub struct PublicLlmArgs {
    /// Address the LLM gateway's public listener binds (e.g. 0.0.0.0:50057), for the
    /// agents of sandboxes off the mesh's hosts (E2B). Empty: off.
    #[arg(long, env = "FORKYARD_LLM_PUBLIC_LISTEN", default_value = "")]
    pub llm_public_listen: String,
    /// The URL such sandboxes are given for that listener (an https ingress in front of
    /// it, reachable from the sandbox provider): their ANTHROPIC_BASE_URL,
    /// OPENAI_BASE_URL (+ /v1) and FORKYARD_LLM_URL.
    #[arg(long, env = "FORKYARD_PUBLIC_LLM_GATEWAY_URL")]
    pub public_llm_gateway_url: Option<String>,
}

/// The public listener bound, and the URL sandboxes get for it.
pub struct PublicLlm {
    pub listener: TcpListener,
    pub url: String,
}

impl PublicLlmArgs {
    /// Both settings or neither; the URL an http(s) URL; the listener bound.
    pub async fn bind(&self) -> Result<Option<PublicLlm>, String> {
        let listen = self.llm_public_listen.trim();
        let url = self
            .public_llm_gateway_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        let (listen, url) = match (listen.is_empty(), url) {
            (true, None) => return Ok(None),
            (false, Some(url)) => (listen, url),
            (true, Some(_)) => return Err(format!("{URL_SETTING} needs {LISTEN_SETTING}")),
            (false, None) => return Err(format!("{LISTEN_SETTING} needs {URL_SETTING}")),
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("{URL_SETTING}: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(format!("{URL_SETTING}: {url:?} is not an http(s) URL"));
        }
        let addr: SocketAddr = listen
            .parse()
            .map_err(|e| format!("{LISTEN_SETTING}: {listen:?}: {e}"))?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{LISTEN_SETTING}: {e}"))?;
        Ok(Some(PublicLlm {
            listener,
            url: url.trim_end_matches('/').to_owned(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(listen: &str, url: Option<&str>) -> PublicLlmArgs {
        PublicLlmArgs {
            llm_public_listen: listen.into(),
            public_llm_gateway_url: url.map(Into::into),
        }
    }

    #[tokio::test]
    async fn both_settings_or_neither_each_error_naming_the_other() {
        assert!(args("", None).bind().await.unwrap().is_none());
        let e = args("", Some("https://llm.example.com"))
            .bind()
            .await
            .err()
            .unwrap();
        assert!(e.contains("FORKYARD_LLM_PUBLIC_LISTEN"), "{e}");
        let e = args("127.0.0.1:0", None).bind().await.err().unwrap();
        assert!(e.contains("FORKYARD_PUBLIC_LLM_GATEWAY_URL"), "{e}");
        let e = args("127.0.0.1:0", Some("ftp://x"))
            .bind()
            .await
            .err()
            .unwrap();
        assert!(e.contains("not an http(s) URL"), "{e}");
        let p = args("127.0.0.1:0", Some("https://llm.example.com/"))
            .bind()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(p.url, "https://llm.example.com");
    }
}
