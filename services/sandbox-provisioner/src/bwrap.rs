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
/// Name resolution, only when the sandbox has network.
const ETC_NETWORK: &[&str] = &["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"];

/// What the host's bubblewrap can do, found by [`probe`] at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// A user namespace can be created and nested ones forbidden (`--disable-userns`).
    pub userns: bool,
}

/// One command to run in one sandbox.
#[derive(Debug)]
pub struct Invocation<'a> {
    pub bwrap: &'a Path,
    pub features: Features,
    pub workspace: &'a Path,
    pub sandbox_id: &'a str,
    pub network: bool,
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
}

impl Invocation<'_> {
    /// The full bwrap argument list (options, `--`, then the command's argv).
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        a.push(["--unshare-all"]);
        if self.network {
            a.push(["--share-net"]);
        }
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
        let etc = ETC_ALWAYS
            .iter()
            .chain(if self.network { ETC_NETWORK } else { &[] });
        for path in etc {
            a.push(["--ro-bind-try", *path, *path]);
        }
        a.push(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        a.push([
            OsStr::new("--bind"),
            self.workspace.as_os_str(),
            OsStr::new(WORKSPACE),
        ]);
        a.push(["--chdir", WORKSPACE, "--hostname", HOSTNAME, "--clearenv"]);
        a.push([
            "--setenv", "PATH", PATH, "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        ]);
        a.push(["--setenv", "FORKYARD_SANDBOX_ID", self.sandbox_id]);
        for (k, v) in self.env {
            a.push(["--setenv", k.as_str(), v.as_str()]);
        }
        a.push(["--"]);
        a.0.extend(self.argv.iter().map(OsString::from));
        a.0
    }

    /// The command, with bwrap's own environment empty too.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(self.bwrap);
        cmd.env_clear().args(self.args());
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
            network: false,
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

    fn args(network: bool) -> Vec<String> {
        let argv = ["ls".to_owned()];
        let env = [("A".to_owned(), "1".to_owned())];
        let inv = Invocation {
            bwrap: Path::new("bwrap"),
            features: Features { userns: true },
            workspace: Path::new("/state/ws"),
            sandbox_id: "sbx-1",
            network,
            argv: &argv,
            env: &env,
        };
        inv.args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    }

    #[test]
    fn isolation_flags_and_command_last() {
        let a = args(false).join(" ");
        assert!(a.starts_with("--unshare-all"), "{a}");
        assert!(!a.contains("--share-net"), "{a}");
        assert!(a.contains("--bind /state/ws /workspace"), "{a}");
        assert!(a.contains("--clearenv"), "{a}");
        assert!(a.contains("--setenv A 1"), "{a}");
        assert!(!a.contains("--ro-bind /etc /etc"), "{a}");
        assert!(!a.contains("resolv.conf"), "{a}");
        assert!(a.ends_with("-- ls"), "{a}");
        let a = args(true).join(" ");
        assert!(
            a.contains("--share-net") && a.contains("resolv.conf"),
            "{a}"
        );
    }
}
