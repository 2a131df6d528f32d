//! Real git servers for the tests of private repositories: git's own smart-HTTP CGI
//! (`git http-backend`) behind lighttpd with basic authentication, as a self-hosted git
//! server or a forge's HTTPS endpoint answers; sshd with one authorized deploy key and
//! its own host key, as a forge's SSH endpoint does; and `git daemon` (`git://`). Each serves a bare copy of a
//! source repository on a free loopback port and is killed when dropped.

mod ssh;

pub use ssh::GitSsh;
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

/// `git daemon` serving a bare copy of a source repository at
/// `git://127.0.0.1:<port>/r.git`, every repository exported, no authentication.
pub struct GitDaemon {
    _server: Server,
    _dir: tempfile::TempDir,
    pub port: u16,
}

impl GitDaemon {
    pub fn serve(src: &Path) -> GitDaemon {
        let dir = tempfile::tempdir().expect("tempdir");
        bare_copy(src, dir.path());
        let port = free_port();
        let log = dir.path().join("daemon.log");
        let server = Server(
            Command::new("git")
                .args([
                    "daemon",
                    "--listen=127.0.0.1",
                    "--export-all",
                    "--reuseaddr",
                ])
                .arg(format!("--port={port}"))
                .arg(format!("--base-path={}", dir.path().display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log"))
                .spawn()
                .expect("git daemon"),
        );
        wait_listening("127.0.0.1", port, "git daemon", &log);
        GitDaemon {
            _server: server,
            _dir: dir,
            port,
        }
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    crate::mesh::free_port()
}

/// Wait until something accepts on `port` of `addr`, or panic naming `what`.
fn wait_listening(addr: &str, port: u16, what: &str, log: &Path) {
    for _ in 0..400 {
        if std::net::TcpStream::connect((addr, port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    panic!("{what} did not listen on port {port}; its log:\n{log}");
}

/// A bare copy of `src` at `<dir>/r.git`.
fn bare_copy(src: &Path, dir: &Path) -> PathBuf {
    bare_copy_as(src, dir, "r")
}

/// A bare copy of `src` at `<dir>/<name>.git`.
fn bare_copy_as(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let bare = dir.join(format!("{name}.git"));
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
/// answers only its users, each with their password (HTTP basic authentication,
/// lighttpd's `plain` backend: the password file is read at each request, so
/// [`GitHttp::set_password`] rotates it at once). An authenticated user may push
/// (`REMOTE_USER` set).
pub struct GitHttp {
    _server: Server,
    dir: tempfile::TempDir,
    pub port: u16,
    /// (user, password), the first the one [`GitHttp::set_password`] changes.
    users: std::sync::Mutex<Vec<(String, String)>>,
}

/// Which versions of git's wire protocol a [`GitHttp`] speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// What the client asks for (version 2 for git's own client).
    Any,
    /// Version 0 only: an `ls-remote` is one GET of `info/refs`, so each POST to
    /// `git-upload-pack` is a fetch (with version 2 an `ls-remote` POSTs too).
    V0,
}

impl GitHttp {
    pub fn serve(src: &Path, user: &str, password: &str) -> GitHttp {
        GitHttp::serve_many(&[("r", src)], user, password, Protocol::Any)
    }

    /// Bare copies of each `(name, src)` served as `/git/<name>.git`.
    pub fn serve_many(
        repos: &[(&str, &Path)],
        user: &str,
        password: &str,
        protocol: Protocol,
    ) -> GitHttp {
        let users = vec![(user.to_owned(), password.to_owned())];
        GitHttp::start(repos, users, |d, port| lighttpd_conf(d, port, protocol))
    }

    /// A bare copy of `src` served as `/git/r.git` to no one at first, then to each
    /// password [`GitHttp::allow`]s: a user may hold several at once, as a forge takes
    /// every unexpired token it issued (a GitHub App's installation tokens, each service
    /// minting its own). Authentication is a CGI gate in front of `git http-backend`
    /// (lighttpd's own takes one password per user).
    pub fn serve_tokens(src: &Path) -> GitHttp {
        GitHttp::start(&[("r", src)], Vec::new(), |d, port| {
            std::fs::write(d.join("gate"), gate_script(d)).expect("gate");
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::Permissions::from_mode(0o755);
            std::fs::set_permissions(d.join("gate"), mode).expect("chmod gate");
            gated_conf(d, port)
        })
    }

    fn start(
        repos: &[(&str, &Path)],
        users: Vec<(String, String)>,
        conf: impl FnOnce(&Path, u16) -> String,
    ) -> GitHttp {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, src) in repos {
            bare_copy_as(src, dir.path(), name);
        }
        let port = free_port();
        let conf_file = dir.path().join("lighttpd.conf");
        let log = dir.path().join("error.log");
        std::fs::write(&conf_file, conf(dir.path(), port)).expect("lighttpd.conf");
        let http = GitHttp {
            _server: Server(
                Command::new("lighttpd")
                    .args(["-D", "-f"])
                    .arg(&conf_file)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).expect("log"))
                    .spawn()
                    .expect("lighttpd (make deps installs it)"),
            ),
            dir,
            port,
            users: std::sync::Mutex::new(users),
        };
        http.write_users();
        wait_listening("127.0.0.1", port, "lighttpd", &log);
        http
    }

    /// The repository's URL (no credentials in it).
    pub fn url(&self) -> String {
        self.url_of("r")
    }

    /// The URL of repository `name` (no credentials in it).
    pub fn url_of(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/git/{name}.git", self.port)
    }

    /// The bare repository served.
    pub fn repo(&self) -> PathBuf {
        self.repo_of("r")
    }

    /// The bare repository served as `name`.
    pub fn repo_of(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.git"))
    }

    /// The requests the server answered so far, one line each (lighttpd's access log:
    /// `"GET /git/r.git/info/refs?service=git-receive-pack HTTP/1.1" 200 …`). Written
    /// through a pipe: lighttpd writes a log file only every second or so, a pipe at
    /// once.
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines().map(str::to_owned).collect()
    }

    /// The upload-pack POSTs of repository `name` answered so far: with
    /// [`Protocol::V0`], its fetches (clones included).
    pub fn fetches(&self, name: &str) -> usize {
        let post = format!("\"POST /git/{name}.git/git-upload-pack ");
        self.requests()
            .iter()
            .filter(|l| l.contains(&post) && l.contains("\" 200 "))
            .count()
    }

    /// From now on the server answers the first user with `password` only.
    pub fn set_password(&self, password: &str) {
        self.users.lock().unwrap()[0].1 = password.to_owned();
        self.write_users();
    }

    /// From now on the server answers `user` too, with `password`.
    pub fn add_user(&self, user: &str, password: &str) {
        let mut users = self.users.lock().unwrap();
        users.retain(|(u, _)| u != user);
        users.push((user.to_owned(), password.to_owned()));
        drop(users);
        self.write_users();
    }

    /// From now on the server (of [`GitHttp::serve_tokens`]) answers `user` with
    /// `password` too, beside the passwords it already takes.
    pub fn allow(&self, user: &str, password: &str) {
        let mut users = self.users.lock().unwrap();
        users.push((user.to_owned(), password.to_owned()));
        drop(users);
        self.write_users();
    }

    fn write_users(&self) {
        let text: String = self
            .users
            .lock()
            .unwrap()
            .iter()
            .map(|(u, p)| format!("{u}:{p}\n"))
            .collect();
        // Whole at once: lighttpd reads the file at each request.
        let file = self.dir.path().join("users");
        let tmp = self.dir.path().join("users.tmp");
        std::fs::write(&tmp, text).expect("users");
        std::fs::rename(tmp, file).expect("users");
    }
}

fn lighttpd_conf(dir: &Path, port: u16, protocol: Protocol) -> String {
    let d = dir.display();
    // http-backend takes the client's `Git-Protocol` header only when its environment
    // names no version.
    let v0 = match protocol {
        Protocol::Any => "",
        Protocol::V0 => r#", "GIT_PROTOCOL" => "version=0""#,
    };
    format!(
        r#"server.document-root = "{d}"
server.bind = "127.0.0.1"
server.port = {port}
server.errorlog = "{d}/error.log"
server.modules = ("mod_auth", "mod_authn_file", "mod_alias", "mod_cgi", "mod_setenv", "mod_accesslog")
accesslog.filename = "|exec cat >> {d}/access.log"
alias.url = ("/git/" => "/usr/lib/git-core/git-http-backend/")
$HTTP["url"] =~ "^/git/" {{
  cgi.assign = ("" => "")
  setenv.add-environment = ("GIT_PROJECT_ROOT" => "{d}", "GIT_HTTP_EXPORT_ALL" => ""{v0})
}}
auth.backend = "plain"
auth.backend.plain.userfile = "{d}/users"
auth.require = ("/git/" => ("method" => "basic", "realm" => "git", "require" => "valid-user"))
"#
    )
}

/// [`GitHttp::serve_tokens`]'s server: every request goes through `gate`.
fn gated_conf(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        r#"server.document-root = "{d}"
server.bind = "127.0.0.1"
server.port = {port}
server.errorlog = "{d}/error.log"
server.modules = ("mod_alias", "mod_cgi", "mod_accesslog")
accesslog.filename = "|exec cat >> {d}/access.log"
alias.url = ("/git/" => "{d}/gate/")
cgi.assign = ("" => "")
"#
    )
}

/// HTTP basic authentication against the `users` file, any of a user's lines, then git
/// as the user (`REMOTE_USER`: pushes are taken); else a 401 asking for credentials.
fn gate_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/bin/sh
given=$(printf '%s' "${{HTTP_AUTHORIZATION#Basic }}" | base64 -d 2>/dev/null)
if [ -n "$given" ] && grep -qxF -e "$given" "{d}/users"; then
  REMOTE_USER=${{given%%:*}} GIT_PROJECT_ROOT="{d}" GIT_HTTP_EXPORT_ALL= exec /usr/lib/git-core/git-http-backend
fi
printf 'Status: 401 Unauthorized
WWW-Authenticate: Basic realm="git"
Content-Type: text/plain

unauthorized
'
"#
    )
}

/// What a mesh's gateway and provisioners get to read (and push to) the git hosts `hosts`
/// (`host:port`, comma-separated) with the credentials file `credentials`: theirs alone,
/// as in production (`MeshOptions::service_env`).
pub fn git_env(hosts: &str, credentials: &Path) -> Vec<(String, String, String)> {
    let file = credentials.display().to_string();
    ["gateway", "sandbox-provisioner"]
        .into_iter()
        .flat_map(|s| {
            [
                (
                    s.to_owned(),
                    "FORKYARD_ALLOWED_GIT_HOSTS".to_owned(),
                    hosts.to_owned(),
                ),
                (
                    s.to_owned(),
                    "FORKYARD_GIT_CREDENTIALS".to_owned(),
                    file.clone(),
                ),
            ]
        })
        .collect()
}

/// The credentials file the delivery suites give their meshes, written into `dir`: team
/// A's `user`/`token` for the git server `http`, whose pull requests go to the GitHub
/// API at `github_api` (a fake forge's).
pub fn github_credentials(
    dir: &Path,
    http: &GitHttp,
    user: &str,
    token: &str,
    github_api: impl std::fmt::Display,
) -> PathBuf {
    let creds = dir.join("git-credentials.toml");
    let text = format!(
        "[[credential]]\nhost = \"127.0.0.1:{}\"\ntenants = [\"team-a\"]\nusername = \"{user}\"\ntoken = \"{token}\"\nforge = \"github\"\napi = \"{github_api}\"\n",
        http.port
    );
    std::fs::write(&creds, text).expect("write the credentials file");
    creds
}

/// A mesh with API keys on (tenants from `forkyard keys`) reading `hosts` with
/// `credentials` ([`git_env`]), with `more` environment for its services.
pub async fn git_mesh(
    hosts: &str,
    credentials: &Path,
    more: Vec<(String, String, String)>,
) -> crate::Mesh {
    let mut service_env = git_env(hosts, credentials);
    service_env.extend(more);
    crate::Mesh::start_with(crate::mesh::MeshOptions {
        api_keys: true,
        service_env,
        ..Default::default()
    })
    .await
    .expect("mesh starts")
}

/// `git --git-dir <repo> <args>` (a served bare repository), which must succeed: its
/// trimmed output.
pub fn git_in(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(args)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
