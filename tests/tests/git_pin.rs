//! Host git held to a remote's checked addresses over ssh and `git://`
//! (`forkyard_common::git_pin`), against a real sshd and a real `git daemon`.
//!
//! The repository is named by a host that resolves nowhere (`git.invalid`, reserved by
//! RFC 2606) and pinned to the loopback address the servers listen on. A read that
//! succeeds therefore went to the pinned address: a git or ssh that resolved the name
//! again (what a rebinding DNS server would answer differently) finds nothing. The
//! same read unpinned fails, which shows it would have resolved. And the host key is
//! still checked under the host's name: a known_hosts file that knows the key only
//! under the address is refused.

use forkyard_common::{
    git_credentials::Credential,
    git_pin::GitPin,
    host_git,
    repo_location::{self, RepoLocation},
};
use forkyard_tests::{
    git_server::{GitDaemon, GitSsh},
    repo,
};
use std::{net::SocketAddr, time::Duration};

/// `git ls-remote <url> HEAD`, pinned to `addr` or not, with `credential`'s environment.
async fn ls_remote(
    url: &str,
    addr: SocketAddr,
    pinned: bool,
    credential: Option<&Credential>,
) -> Result<String, String> {
    let Ok(RepoLocation::Remote(remote)) = repo_location::locate(url) else {
        panic!("{url}")
    };
    let env = credential.map(|c| c.git_env(&remote)).unwrap_or_default();
    let pin = if pinned {
        GitPin::new(url, &remote, &[addr]).await
    } else {
        GitPin::default()
    };
    let mut cmd = host_git::command(&pin.args, &pin.env(env));
    cmd.args(["ls-remote", "--", url, "HEAD"]);
    let out = host_git::output(cmd, None, Duration::from_secs(30)).await?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn source() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    src
}

#[tokio::test]
async fn ssh_reads_go_to_the_pinned_address_and_check_the_key_by_name() {
    let src = source();
    let ssh = GitSsh::serve(src.path());
    let addr: SocketAddr = format!("127.0.0.1:{}", ssh.port).parse().unwrap();
    let url = format!(
        "ssh://root@git.invalid:{}{}",
        ssh.port,
        ssh.repo().display()
    );
    // The operator's known_hosts names the host, as ssh does off port 22.
    let key = std::fs::read_to_string(ssh.known_hosts()).unwrap();
    let key = key.split_once(' ').unwrap().1;
    let dir = tempfile::tempdir().unwrap();
    let known = dir.path().join("known_hosts");
    std::fs::write(&known, format!("[git.invalid]:{} {key}", ssh.port)).unwrap();
    let credential = Credential::SshKey {
        key_file: ssh.key(),
        known_hosts: known,
    };

    let head = ls_remote(&url, addr, true, Some(&credential)).await;
    assert!(head.as_ref().is_ok_and(|h| h.contains("HEAD")), "{head:?}");

    let unpinned = ls_remote(&url, addr, false, Some(&credential)).await;
    let why = unpinned.expect_err("git.invalid resolves nowhere");
    assert!(why.contains("git.invalid"), "{why}");

    // The key known only under the address (`[127.0.0.1]:port`): not the host's.
    let by_address = Credential::SshKey {
        key_file: ssh.key(),
        known_hosts: ssh.known_hosts(),
    };
    let why = ls_remote(&url, addr, true, Some(&by_address))
        .await
        .expect_err("a key known under the address only is not the host's");
    assert!(why.contains("Host key verification failed"), "{why}");
}

#[tokio::test]
async fn git_daemon_reads_go_to_the_pinned_address() {
    let src = source();
    let daemon = GitDaemon::serve(src.path());
    let port = daemon.port;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Spelled as a caller may: git matches the URL's text.
    let url = format!("git://Git.Invalid:{port}/r.git");

    let head = ls_remote(&url, addr, true, None).await;
    assert!(head.as_ref().is_ok_and(|h| h.contains("HEAD")), "{head:?}");

    let why = ls_remote(&url, addr, false, None)
        .await
        .expect_err("git.invalid resolves nowhere");
    assert!(why.to_lowercase().contains("git.invalid"), "{why}");
}
