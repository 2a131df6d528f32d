//! Real git servers for the tests of private repositories: git's own smart-HTTP CGI
//! (`git http-backend`) behind lighttpd with basic authentication, as a self-hosted git
//! server or a forge's HTTPS endpoint answers; and sshd with one authorized deploy key
//! and its own host key, as a forge's SSH endpoint does. Each serves a bare copy of a
//! source repository on a free loopback port and is killed when dropped.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

/// A server process, killed and reaped when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    crate::mesh::free_port()
}

/// Wait until something accepts on `port`, or panic naming `what`.
fn wait_listening(port: u16, what: &str, log: &Path) {
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    panic!("{what} did not listen on port {port}; its log:\n{log}");
}

/// A bare copy of `src` at `<dir>/r.git`.
fn bare_copy(src: &Path, dir: &Path) -> PathBuf {
    let bare = dir.join("r.git");
    let ok = Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(src)
        .arg(&bare)
        .status()
        .expect("git clone --bare")
        .success();
    assert!(ok, "git clone --bare of {}", src.display());
    bare
}

/// `git http-backend` behind lighttpd at `http://127.0.0.1:<port>/git/r.git`, which
/// answers only `user` with `password` (HTTP basic authentication, lighttpd's `plain`
/// backend: the password file is read at each request, so [`GitHttp::set_password`]
/// rotates it at once). An authenticated user may push (`REMOTE_USER` set).
pub struct GitHttp {
    _server: Server,
    dir: tempfile::TempDir,
    pub port: u16,
    user: String,
}

impl GitHttp {
    pub fn serve(src: &Path, user: &str, password: &str) -> GitHttp {
        let dir = tempfile::tempdir().expect("tempdir");
        bare_copy(src, dir.path());
        let port = free_port();
        let conf = dir.path().join("lighttpd.conf");
        let log = dir.path().join("error.log");
        std::fs::write(&conf, lighttpd_conf(dir.path(), port)).expect("lighttpd.conf");
        let http = GitHttp {
            _server: Server(
                Command::new("lighttpd")
                    .args(["-D", "-f"])
                    .arg(&conf)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).expect("log"))
                    .spawn()
                    .expect("lighttpd (make deps installs it)"),
            ),
            dir,
            port,
            user: user.to_owned(),
        };
        http.set_password(password);
        wait_listening(port, "lighttpd", &log);
        http
    }

    /// The repository's URL (no credentials in it).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/git/r.git", self.port)
    }

    /// The bare repository served.
    pub fn repo(&self) -> PathBuf {
        self.dir.path().join("r.git")
    }

    /// The requests the server answered so far, one line each (lighttpd's access log:
    /// `"GET /git/r.git/info/refs?service=git-receive-pack HTTP/1.1" 200 …`).
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines().map(str::to_owned).collect()
    }

    /// From now on the server answers `password` only.
    pub fn set_password(&self, password: &str) {
        let file = self.dir.path().join("users");
        std::fs::write(file, format!("{}:{password}\n", self.user)).expect("users");
    }
}

fn lighttpd_conf(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        r#"server.document-root = "{d}"
server.bind = "127.0.0.1"
server.port = {port}
server.errorlog = "{d}/error.log"
server.modules = ("mod_auth", "mod_authn_file", "mod_alias", "mod_cgi", "mod_setenv", "mod_accesslog")
accesslog.filename = "{d}/access.log"
alias.url = ("/git/" => "/usr/lib/git-core/git-http-backend/")
$HTTP["url"] =~ "^/git/" {{
  cgi.assign = ("" => "")
  setenv.add-environment = ("GIT_PROJECT_ROOT" => "{d}", "GIT_HTTP_EXPORT_ALL" => "")
}}
auth.backend = "plain"
auth.backend.plain.userfile = "{d}/users"
auth.require = ("/git/" => ("method" => "basic", "realm" => "git", "require" => "valid-user"))
"#
    )
}

/// sshd at `ssh://root@127.0.0.1:<port>/<dir>/r.git`, which takes one key only (the
/// deploy key at [`GitSsh::key`], no password) and presents its own host key
/// ([`GitSsh::known_hosts`] holds it, as an operator's known_hosts file would).
pub struct GitSsh {
    _server: Server,
    dir: tempfile::TempDir,
    pub port: u16,
}

impl GitSsh {
    pub fn serve(src: &Path) -> GitSsh {
        let dir = tempfile::tempdir().expect("tempdir");
        bare_copy(src, dir.path());
        let d = dir.path();
        keygen(&d.join("host_key"));
        keygen(&d.join("deploy_key"));
        std::fs::copy(d.join("deploy_key.pub"), d.join("authorized_keys")).expect("authorized");
        // sshd's privilege separation directory (made by the package's service unit,
        // which nothing here starts).
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let port = free_port();
        let conf = d.join("sshd_config");
        std::fs::write(&conf, sshd_conf(d, port)).expect("sshd_config");
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
        wait_listening(port, "sshd", &log);
        let host = std::fs::read_to_string(d.join("host_key.pub")).expect("host key");
        std::fs::write(
            d.join("known_hosts"),
            format!("[127.0.0.1]:{port} {}", host.trim()),
        )
        .expect("known_hosts");
        GitSsh {
            _server: server,
            dir,
            port,
        }
    }

    pub fn url(&self) -> String {
        format!(
            "ssh://root@127.0.0.1:{}{}",
            self.port,
            self.repo().display()
        )
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

fn sshd_conf(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "Port {port}
ListenAddress 127.0.0.1
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
