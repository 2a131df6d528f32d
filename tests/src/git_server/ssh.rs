//! sshd with one authorized deploy key and its own host key, as a forge's SSH endpoint
//! answers: a bare copy of a source repository on a free loopback port, killed when
//! dropped.

use super::{Server, bare_copy, free_port, wait_listening};
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// sshd at `ssh://root@<addr>:<port>/<dir>/r.git`, which takes one key only (the
/// deploy key at [`GitSsh::key`], no password) and presents its own host key
/// ([`GitSsh::known_hosts`] holds it, as an operator's known_hosts file would).
pub struct GitSsh {
    _server: Server,
    dir: tempfile::TempDir,
    pub addr: String,
    pub port: u16,
}

impl GitSsh {
    /// On a free port of 127.0.0.1.
    pub fn serve(src: &Path) -> GitSsh {
        GitSsh::serve_on(src, "127.0.0.1", free_port())
    }

    /// On `port` of loopback address `addr`: port 22 for git's scp-like form
    /// (`root@<addr>:<path>`), which has no place for a port.
    pub fn serve_on(src: &Path, addr: &str, port: u16) -> GitSsh {
        // Else the wait below would find the other server, with another host key.
        assert!(
            std::net::TcpStream::connect((addr, port)).is_err(),
            "{addr}:{port} is taken (an sshd of the host's on port 22?)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        bare_copy(src, dir.path());
        let d = dir.path();
        keygen(&d.join("host_key"));
        keygen(&d.join("deploy_key"));
        std::fs::copy(d.join("deploy_key.pub"), d.join("authorized_keys")).expect("authorized");
        // sshd's privilege separation directory (made by the package's service unit,
        // which nothing here starts).
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let conf = d.join("sshd_config");
        std::fs::write(&conf, sshd_conf(d, addr, port)).expect("sshd_config");
        let log = d.join("sshd.log");
        let server = Server(
            Command::new("/usr/sbin/sshd")
                .args(["-D", "-e", "-f"])
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log"))
                .spawn()
                .expect("sshd (make deps installs openssh-server)"),
        );
        wait_listening(addr, port, "sshd", &log);
        let host = std::fs::read_to_string(d.join("host_key.pub")).expect("host key");
        // ssh names a host on its default port without brackets.
        let name = if port == 22 {
            addr.to_owned()
        } else {
            format!("[{addr}]:{port}")
        };
        std::fs::write(d.join("known_hosts"), format!("{name} {}", host.trim()))
            .expect("known_hosts");
        GitSsh {
            _server: server,
            dir,
            addr: addr.to_owned(),
            port,
        }
    }

    pub fn url(&self) -> String {
        format!(
            "ssh://root@{}:{}{}",
            self.addr,
            self.port,
            self.repo().display()
        )
    }

    /// git's scp-like form, `root@<addr>:<path>`: ssh's default port (22) only.
    pub fn scp_url(&self) -> String {
        format!("root@{}:{}", self.addr, self.repo().display())
    }

    pub fn repo(&self) -> PathBuf {
        self.dir.path().join("r.git")
    }

    /// The deploy key's private half.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("deploy_key")
    }

    /// A known_hosts file with the server's host key.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }
}

fn keygen(path: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "forkyard-test", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen")
        .success();
    assert!(ok, "ssh-keygen {}", path.display());
}

fn sshd_conf(dir: &Path, addr: &str, port: u16) -> String {
    let d = dir.display();
    format!(
        "Port {port}
ListenAddress {addr}
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
"
    )
}
