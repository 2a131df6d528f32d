//! Building the bubblewrap command line for one command in one sandbox.
//!
//! Every exec gets fresh namespaces (mount, pid, ipc, uts, net, cgroup and user where
//! the host allows), a read-only /usr, a minimal read-only /etc, private /proc, /dev
//! and /tmp, and the workspace at /workspace. Nothing else of the host is visible and
//! the environment is rebuilt from scratch.

use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
    sync::OnceLock,
    time::Duration,
};
use tokio::process::Command;

pub const HOSTNAME: &str = "forkyard-sandbox";
pub const WORKSPACE: &str = "/workspace";
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Variables every sandboxed command gets; a request may not set these itself.
pub const RESERVED_ENV: &[&str] = &["FORKYARD_SANDBOX_ID"];

/// Files and directories of the host's /etc that programs need. Not the whole /etc:
/// it holds secrets and host configuration the sandbox has no business seeing.
const ETC_ALWAYS: &[&str] = &[
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/passwd",
    "/etc/group",
    "/etc/ssl/certs",
];

/// Where the provisioner's helpers appear inside the sandbox.
pub const FORWARDER_IN_SANDBOX: &str = "/run/forkyard/egress-forwarder";
pub const PROXY_SOCKET_IN_SANDBOX: &str = "/run/forkyard/egress.sock";
/// The in-sandbox address of the egress proxy (the forwarder listens there).
pub const PROXY_ADDR: &str = "127.0.0.1:3128";

/// Joins the cgroups named by its arguments (up to `--`), then execs the rest: every
/// process of the sandbox is in its cgroups from its first instruction.
const JOIN_CGROUPS: &str = r#"for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift; exec "$@""#;

/// What the host's bubblewrap can do, found by [`probe`] at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// A user namespace can be created and nested ones forbidden (`--disable-userns`).
    pub userns: bool,
}

/// Egress through the provisioner's allowlist proxy: its Unix socket on the host and the
/// forwarder binary that exposes it on [`PROXY_ADDR`] inside the sandbox's own netns.
#[derive(Debug, Clone, Copy)]
pub struct Egress<'a> {
    pub socket: &'a Path,
    pub forwarder: &'a Path,
}

/// One command to run in one sandbox.
#[derive(Debug)]
pub struct Invocation<'a> {
    pub bwrap: &'a Path,
    pub features: Features,
    pub workspace: &'a Path,
    pub sandbox_id: &'a str,
    /// `None`: no network at all. The sandbox always has its own network namespace.
    pub egress: Option<Egress<'a>>,
    /// `cgroup.procs` files the command joins before bubblewrap starts.
    pub cgroup_procs: &'a [PathBuf],
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
}

impl Invocation<'_> {
    /// The full bwrap argument list (options, `--`, then the command's argv). No
    /// environment value is ever on it (argv is world-readable in `ps`): see [`Self::env`].
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        // Every namespace, the network one included, also when egress is allowed.
        a.push(["--unshare-all"]);
        if self.features.userns {
            a.push(["--unshare-user", "--disable-userns"]);
        }
        a.push(["--die-with-parent", "--new-session", "--cap-drop", "ALL"]);
        a.push(["--ro-bind", "/usr", "/usr"]);
        for (path, link) in host_root_links() {
            match link {
                Some(target) => a.push([
                    OsStr::new("--symlink"),
                    target.as_os_str(),
                    path.as_os_str(),
                ]),
                None => a.push([OsStr::new("--ro-bind"), path.as_os_str(), path.as_os_str()]),
            }
        }
        for path in ETC_ALWAYS {
            a.push(["--ro-bind-try", *path, *path]);
        }
        a.push(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        if let Some(e) = self.egress {
            a.push([
                OsStr::new("--ro-bind"),
                e.forwarder.as_os_str(),
                OsStr::new(FORWARDER_IN_SANDBOX),
            ]);
            a.push([
                OsStr::new("--bind"),
                e.socket.as_os_str(),
                OsStr::new(PROXY_SOCKET_IN_SANDBOX),
            ]);
        }
        a.push([
            OsStr::new("--bind"),
            self.workspace.as_os_str(),
            OsStr::new(WORKSPACE),
        ]);
        a.push(["--chdir", WORKSPACE, "--hostname", HOSTNAME]);
        // The environment is bwrap's own (built from scratch in `command`), minus what a
        // wrapper shell may have added.
        a.push([
            "--unsetenv",
            "PWD",
            "--unsetenv",
            "SHLVL",
            "--unsetenv",
            "_",
        ]);
        a.push(["--"]);
        if self.egress.is_some() {
            a.push([
                FORWARDER_IN_SANDBOX,
                PROXY_ADDR,
                PROXY_SOCKET_IN_SANDBOX,
                "--",
            ]);
        }
        a.0.extend(self.argv.iter().map(OsString::from));
        a.0
    }

    /// The sandboxed command's whole environment.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            ("PATH", PATH),
            ("HOME", "/tmp"),
            ("LANG", "C.UTF-8"),
            ("FORKYARD_SANDBOX_ID", self.sandbox_id),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        if self.egress.is_some() {
            let url = format!("http://{PROXY_ADDR}");
            for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((k.to_owned(), url.clone()));
            }
            env.push(("NO_PROXY".into(), "localhost,127.0.0.1".into()));
        }
        env.extend(self.env.iter().cloned());
        env
    }

    /// The command: bubblewrap (behind the cgroup-joining shell when there are cgroups),
    /// with an environment holding exactly [`Self::env`]. The values travel in the
    /// process environment (`/proc/<pid>/environ`, owner-only), never on a command line.
    pub fn command(&self) -> Command {
        let mut cmd = if self.cgroup_procs.is_empty() {
            Command::new(self.bwrap)
        } else {
            let mut c = Command::new("/bin/sh");
            c.args(["-c", JOIN_CGROUPS, "forkyard-join"]);
            c.args(self.cgroup_procs);
            c.arg("--").arg(self.bwrap);
            c
        };
        cmd.env_clear().envs(self.env()).args(self.args());
        cmd
    }
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, items: I) {
        self.0
            .extend(items.into_iter().map(|s| s.as_ref().to_owned()));
    }
}

/// The host's top-level /bin, /lib, /lib64, /sbin (and multilib dirs): `Some(target)` for
/// a symlink into /usr (merged-/usr hosts), `None` for a real directory to bind read-only.
fn host_root_links() -> &'static [(PathBuf, Option<PathBuf>)] {
    static LINKS: OnceLock<Vec<(PathBuf, Option<PathBuf>)>> = OnceLock::new();
    LINKS.get_or_init(|| {
        ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"]
            .iter()
            .filter_map(|p| {
                let path = PathBuf::from(p);
                let meta = std::fs::symlink_metadata(&path).ok()?;
                if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).ok()?;
                    // Only links that stay inside /usr: anything else would not resolve.
                    let resolved = std::fs::canonicalize(&path).ok()?;
                    resolved.starts_with("/usr").then_some((path, Some(target)))
                } else if meta.is_dir() {
                    Some((path, None))
                } else {
                    None
                }
            })
            .collect()
    })
}

/// Check that `bwrap` runs a sandbox on this host and find which features it has.
pub async fn probe(bwrap: &Path, scratch: &Path) -> Result<Features, String> {
    let argv = ["true".to_owned()];
    let mut last_err = String::new();
    for features in [Features { userns: true }, Features { userns: false }] {
        let inv = Invocation {
            bwrap,
            features,
            workspace: scratch,
            sandbox_id: "probe",
            egress: None,
            cgroup_procs: &[],
            argv: &argv,
            env: &[],
        };
        let mut cmd = inv.command();
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

/// `path` if it names an executable, else the first match on `$PATH`.
pub fn resolve(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if path.components().count() > 1 {
        return executable(path).then(|| path.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(path))
        .find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv_args(egress: bool) -> (Vec<String>, Vec<(String, String)>) {
        let argv = ["ls".to_owned()];
        let env = [("A".to_owned(), "secret-value".to_owned())];
        let inv = Invocation {
            bwrap: Path::new("bwrap"),
            features: Features { userns: true },
            workspace: Path::new("/state/ws"),
            sandbox_id: "sbx-1",
            egress: egress.then_some(Egress {
                socket: Path::new("/state/egress.sock"),
                forwarder: Path::new("/bin/fwd"),
            }),
            cgroup_procs: &[],
            argv: &argv,
            env: &env,
        };
        let args = inv
            .args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        (args, inv.env())
    }

    #[test]
    fn isolation_flags_and_command_last_and_no_env_on_argv() {
        let (a, env) = inv_args(false);
        let a = a.join(" ");
        assert!(a.starts_with("--unshare-all"), "{a}");
        assert!(!a.contains("--share-net"), "{a}");
        assert!(a.contains("--bind /state/ws /workspace"), "{a}");
        assert!(!a.contains("secret-value") && !a.contains("sbx-1"), "{a}");
        assert!(env.contains(&("A".into(), "secret-value".into())));
        assert!(env.contains(&("FORKYARD_SANDBOX_ID".into(), "sbx-1".into())));
        assert!(!a.contains("--ro-bind /etc /etc"), "{a}");
        assert!(!a.contains("resolv.conf"), "{a}");
        assert!(a.ends_with("-- ls"), "{a}");
        let (a, env) = inv_args(true);
        let a = a.join(" ");
        assert!(
            !a.contains("--share-net"),
            "egress keeps its own netns: {a}"
        );
        assert!(
            a.ends_with(
                "-- /run/forkyard/egress-forwarder 127.0.0.1:3128 /run/forkyard/egress.sock -- ls"
            ),
            "{a}"
        );
        assert!(
            env.iter()
                .any(|(k, v)| k == "HTTPS_PROXY" && v == "http://127.0.0.1:3128")
        );
    }
}
