//! Host git held to a remote's checked addresses, whatever its transport. The host's
//! name was resolved once and every address checked (`crate::allowed_hosts`); a git
//! that resolved it again could be answered otherwise by a rebinding DNS server, and
//! reach the mesh's own services or a cloud's metadata endpoint.
//!
//! - http(s): curl is given the checked addresses for the host's name
//!   (`http.curloptResolve`) and tries them in order as it would its own answer; no
//!   redirect is followed.
//! - ssh (`ssh://` and `user@host:path`): ssh connects to one checked address
//!   (`-oHostName`), the first that accepts a connection (ssh itself tries its answer's
//!   addresses in order: a host whose IPv6 address is unreachable from here still works),
//!   and checks the host key under the name the operator's known_hosts file has for the
//!   host (`-oHostKeyAlias`: `host`, or `[host]:port` off port 22, as ssh names it).
//! - `git://`: the URL's host is replaced by that address (`url.<pinned>.insteadOf`). The
//!   daemon then sees the address in its request's `host=` field, which only a daemon
//!   serving virtual hosts reads.
//!
//! An IP literal needs none of this: there is nothing to resolve again.

use crate::repo_location::{Remote, Transport};
use std::{net::SocketAddr, time::Duration};

/// ssh as host git runs it when no credential names another: never a prompt.
pub const SSH_COMMAND: &str = "ssh -oBatchMode=yes";

/// How long the choice of an ssh or git address waits for each one to accept.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What holds one remote's reads and writes to its checked addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitPin {
    /// `git -c` settings, before the subcommand.
    pub args: Vec<String>,
    /// Options appended to the ssh command (ssh takes the first value of an option).
    ssh: Option<String>,
}

impl GitPin {
    /// The pin of `repo` (as the caller wrote it), located as `remote`, to `addrs`.
    pub async fn new(repo: &str, remote: &Remote, addrs: &[SocketAddr]) -> Self {
        let mut pin = Self {
            args: http_args(remote, addrs),
            ssh: None,
        };
        if remote.host.parse::<std::net::IpAddr>().is_ok() {
            return pin;
        }
        match remote.transport {
            Transport::Ssh => {
                if let Some(addr) = first_accepting(addrs).await {
                    pin.ssh = Some(ssh_options(remote, addr));
                }
            }
            Transport::Git => {
                if let Some(addr) = first_accepting(addrs).await {
                    pin.args.extend(git_daemon_args(repo, addr));
                }
            }
            Transport::Https | Transport::Http => {}
        }
        pin
    }

    /// `env` (the credential's, if any) with the pin's ssh options in its ssh command.
    pub fn env(&self, mut env: Vec<(String, String)>) -> Vec<(String, String)> {
        let Some(options) = &self.ssh else {
            return env;
        };
        match env.iter_mut().find(|(k, _)| k == "GIT_SSH_COMMAND") {
            Some((_, command)) => {
                command.push(' ');
                command.push_str(options);
            }
            None => env.push(("GIT_SSH_COMMAND".into(), format!("{SSH_COMMAND} {options}"))),
        }
        env
    }
}

/// `git -c` settings for every transport: no redirect followed, and curl given the
/// checked addresses of a named http(s) host.
fn http_args(remote: &Remote, addrs: &[SocketAddr]) -> Vec<String> {
    let mut out = vec!["-c".to_owned(), "http.followRedirects=false".to_owned()];
    let named = remote.host.parse::<std::net::IpAddr>().is_err();
    if named && matches!(remote.transport, Transport::Https | Transport::Http) {
        let list: Vec<String> = addrs.iter().map(|a| bracketed(a.ip())).collect();
        out.push("-c".to_owned());
        out.push(format!(
            "http.curloptResolve={}:{}:{}",
            remote.host,
            remote.port,
            list.join(",")
        ));
    }
    out
}

/// ssh's options for a connection to `addr` checked under the host's own name.
fn ssh_options(remote: &Remote, addr: SocketAddr) -> String {
    let alias = if remote.port == 22 {
        remote.host.clone()
    } else {
        format!("[{}]:{}", remote.host, remote.port)
    };
    // git runs the command with a shell: `[` would be a glob. Host names are checked
    // (`valid_host`), so none holds a quote.
    format!(
        "-oHostName={} '-oHostKeyAlias={alias}' -oCheckHostIP=no",
        addr.ip()
    )
}

/// `url.git://<addr>/.insteadOf=git://<authority>/`, the authority as `repo` spells it
/// (git matches the URL's text, not the host it names).
fn git_daemon_args(repo: &str, addr: SocketAddr) -> Vec<String> {
    let Some(rest) = repo.get(..6).filter(|s| s.eq_ignore_ascii_case("git://")) else {
        return Vec::new();
    };
    let authority = repo[6..].split('/').next().unwrap_or_default();
    vec![
        "-c".to_owned(),
        format!(
            "url.git://{}:{}/.insteadOf={rest}{authority}/",
            bracketed(addr.ip()),
            addr.port()
        ),
    ]
}

fn bracketed(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(a) => a.to_string(),
        std::net::IpAddr::V6(a) => format!("[{a}]"),
    }
}

/// The first of `addrs` that accepts a TCP connection, in order; else the first (its
/// error is then git's). None only for no addresses.
async fn first_accepting(addrs: &[SocketAddr]) -> Option<SocketAddr> {
    if addrs.len() > 1 {
        for addr in addrs {
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await {
                return Some(*addr);
            }
        }
    }
    addrs.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo_location::{RepoLocation, locate};

    fn remote(repo: &str) -> Remote {
        let Ok(RepoLocation::Remote(r)) = locate(repo) else {
            panic!("{repo}")
        };
        r
    }

    async fn pin(repo: &str, addrs: &[&str]) -> GitPin {
        let addrs: Vec<SocketAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        GitPin::new(repo, &remote(repo), &addrs).await
    }

    #[tokio::test]
    async fn http_reads_are_given_every_checked_address() {
        let p = pin(
            "https://git.example:8443/a",
            &["10.0.0.7:8443", "[fd00::7]:8443"],
        )
        .await;
        assert_eq!(
            p.args,
            [
                "-c",
                "http.followRedirects=false",
                "-c",
                "http.curloptResolve=git.example:8443:10.0.0.7,[fd00::7]"
            ]
        );
        assert_eq!(p.env(vec![]), vec![], "no ssh command for https");
    }

    #[tokio::test]
    async fn ssh_connects_to_the_checked_address_and_checks_the_key_by_name() {
        let p = pin("git@git.example:org/r.git", &["192.0.2.7:22"]).await;
        assert_eq!(
            p.env(vec![]),
            [(
                "GIT_SSH_COMMAND".to_owned(),
                "ssh -oBatchMode=yes -oHostName=192.0.2.7 '-oHostKeyAlias=git.example' \
                 -oCheckHostIP=no"
                    .to_owned()
            )]
        );
        // Off port 22 the key is known as `[host]:port`; a credential's command keeps
        // its own options first.
        let p = pin("ssh://git@git.example:2222/r.git", &["[2001:db8::7]:2222"]).await;
        let env = p.env(vec![("GIT_SSH_COMMAND".into(), "ssh -i /k".into())]);
        assert_eq!(
            env[0].1,
            "ssh -i /k -oHostName=2001:db8::7 '-oHostKeyAlias=[git.example]:2222' \
             -oCheckHostIP=no"
        );
    }

    #[tokio::test]
    async fn git_daemon_urls_are_rewritten_to_the_address_as_written() {
        let p = pin("GIT://Git.Example/r.git", &["192.0.2.7:9418"]).await;
        assert_eq!(
            p.args[2..],
            [
                "-c",
                "url.git://192.0.2.7:9418/.insteadOf=GIT://Git.Example/"
            ]
        );
    }

    #[tokio::test]
    async fn an_ip_literal_is_not_pinned_again() {
        let p = pin("ssh://git@192.0.2.7/r.git", &["192.0.2.7:22"]).await;
        assert_eq!(p.env(vec![]), vec![]);
        let p = pin("git://192.0.2.7/r.git", &["192.0.2.7:9418"]).await;
        assert_eq!(p.args, ["-c", "http.followRedirects=false"]);
    }

    #[tokio::test]
    async fn the_first_address_that_answers_is_taken() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = open.local_addr().unwrap().port();
        // Nothing listens on ::1 at that port (or IPv6 is off): refused at once.
        let repo = format!("ssh://git@git.example:{port}/r.git");
        let addrs = [
            format!("[::1]:{port}").parse().unwrap(),
            format!("127.0.0.1:{port}").parse().unwrap(),
        ];
        let p = GitPin::new(&repo, &remote(&repo), &addrs).await;
        assert!(
            p.env(vec![])[0].1.contains("-oHostName=127.0.0.1 "),
            "{p:?}"
        );
    }
}
