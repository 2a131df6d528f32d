//! Building the bubblewrap command line for one command in one sandbox.
//!
//! Every exec gets fresh namespaces (mount, pid, ipc, uts, net, cgroup and user where
//! the host allows), a read-only /usr, a minimal read-only /etc, private /proc, /dev
//! and /tmp, and the workspace at /workspace. Nothing else of the host is visible and
//! the environment is rebuilt from scratch.

use super::{enter, vfork};
use crate::local::isolation::{
    host_tools::{self, Toolchain},
    network::forwarder_kit::{self, ForwarderKit},
    open_files,
};
use command_fds::{CommandFdExt, FdMapping};
use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
    sync::OnceLock,
};
use tokio::process::Command;

pub const HOSTNAME: &str = "forkyard-sandbox";
pub const WORKSPACE: &str = "/workspace";
pub const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
pub use crate::local::isolation::host_tools::TOOLS;

/// The descriptor bwrap reads the sandboxed command's environment from (`--args`).
pub const ENV_FD: i32 = 3;
const ENV_FD_STR: &str = "3";
/// The first descriptor of the seccomp filters (`--add-seccomp-fd`), one each.
const SECCOMP_FD: i32 = 4;

/// Files and directories of the host's /etc that programs need. Not the whole /etc:
/// it holds secrets and host configuration the sandbox has no business seeing.
pub(crate) const ETC_ALWAYS: &[&str] = &[
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/passwd",
    "/etc/group",
    "/etc/ssl/certs",
];

/// Where the provisioner's helpers appear inside the sandbox.
pub const PROXY_SOCKET_IN_SANDBOX: &str = "/run/forkyard/egress.sock";
pub const LLM_SOCKET_IN_SANDBOX: &str = "/run/forkyard/llm.sock";
/// The in-sandbox address of the egress proxy (the forwarder listens there).
pub const PROXY_ADDR: &str = "127.0.0.1:3128";

/// What the host's bubblewrap can do, found by [`super::probe::probe`] at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// A user namespace can be created and nested ones forbidden (`--disable-userns`).
    pub userns: bool,
}

/// The sandbox's ways out: Unix sockets of the provisioner (the egress allowlist proxy,
/// the LLM relay), each exposed on a loopback address inside the sandbox's own netns by
/// the forwarder binary.
#[derive(Debug, Clone, Copy)]
pub struct Relays<'a> {
    /// The forwarder with its loader and libraries (`forwarder_kit`).
    pub forwarder: &'a ForwarderKit,
    /// The egress proxy's socket, exposed on [`PROXY_ADDR`].
    pub egress: Option<&'a Path>,
    /// The LLM relay's socket, exposed on [`forkyard_proto::SANDBOX_LLM_ADDR`].
    pub llm: Option<&'a Path>,
}

impl Relays<'_> {
    fn any(&self) -> bool {
        self.egress.is_some() || self.llm.is_some()
    }

    /// `(address in the sandbox, socket in the sandbox, socket on the host)` of each.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, &'static str, &Path)> {
        let mut out = Vec::new();
        if let Some(s) = self.egress {
            out.push((PROXY_ADDR, PROXY_SOCKET_IN_SANDBOX, s));
        }
        if let Some(s) = self.llm {
            out.push((forkyard_proto::SANDBOX_LLM_ADDR, LLM_SOCKET_IN_SANDBOX, s));
        }
        out
    }
}

/// An image's root filesystem as the sandbox's `/`, and its environment.
#[derive(Debug, Clone, Copy)]
pub struct ImageRoot<'a> {
    /// Unpacked, with the mount points bubblewrap needs (`crate::local::storage::image`).
    pub rootfs: &'a Path,
    /// The image's `Env`; `HOME` and reserved names are not taken from it.
    pub env: &'a [(String, String)],
}

/// One command to run in one sandbox.
#[derive(Debug)]
pub struct Invocation<'a> {
    pub bwrap: &'a Path,
    pub features: Features,
    /// Bound at `/workspace`: the sandbox's workspace directory.
    pub workspace: &'a Path,
    /// An overlay workspace's mount (`crate::local::storage::overlay`), put on `workspace` in the
    /// launching child's own mount namespace before bubblewrap binds it.
    pub overlay: Option<std::os::fd::BorrowedFd<'a>>,
    pub sandbox_id: &'a str,
    /// `None`: no network at all. The sandbox always has its own network namespace.
    pub relays: Option<Relays<'a>>,
    /// The cgroup files the command joins through before bubblewrap starts
    /// (`Cgroups::join_files`).
    pub cgroup_joins: &'a [PathBuf],
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    /// Seccomp filters the command runs under (compiled BPF; see `crate::local::isolation::bubblewrap::seccomp`).
    pub seccomp: &'a [Vec<u8>],
    /// A host directory of agent CLIs bound at [`TOOLS`] (`--agent-tools`).
    pub tools: Option<&'a Path>,
    /// Toolchains bound at `TOOLCHAINS/<name>` (`--toolchains`), their `bin` on PATH.
    pub toolchains: &'a [Toolchain],
    /// The host uid bubblewrap and the command run as (`crate::local::isolation::uids`); `None`: the
    /// provisioner's.
    pub uid: Option<u32>,
    /// `None`: the host's /usr (and the few files of /etc programs need), read-only.
    pub image: Option<ImageRoot<'a>>,
    /// The sandbox's init (`crate::local::isolation::init`): the forwarder in `--init` mode, `argv` the
    /// way to start it again; `relays` holds its kit.
    pub init: bool,
    /// The largest file any of the sandbox's processes may write (`RLIMIT_FSIZE`; see
    /// `crate::local::storage::disk_quota::file_size_limit`); `None`: no bound.
    pub file_size: Option<u64>,
}

impl Invocation<'_> {
    /// The relays, when the forwarder runs first in the sandbox: it has relays to offer,
    /// or it is the sandbox's init.
    pub(crate) fn kit(&self) -> Option<Relays<'_>> {
        self.relays.filter(|r| self.init || r.any())
    }

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
        if self.init && self.kit().is_some() {
            // The init reaps every process of the sandbox itself: no reaper process of
            // bubblewrap's in front of it (one process less each time a sandbox starts).
            a.push(["--as-pid-1"]);
        }
        self.root(&mut a);
        self.mounts(&mut a);
        // The sandboxed command's environment comes from this file descriptor, read
        // by bwrap once it runs: `--clearenv` first, then a `--setenv` per variable
        // (see [`Self::env_args`]). Neither the wrapper shell nor bwrap is ever started
        // with a caller's variable: on the host they would act on host processes
        // running as the provisioner (`LD_PRELOAD` of a library in a workspace).
        for fd in (SECCOMP_FD..).take(self.seccomp.len()) {
            a.push([
                OsString::from("--add-seccomp-fd"),
                OsString::from(fd.to_string()),
            ]);
        }
        a.push(["--args", ENV_FD_STR]);
        a.push(["--"]);
        a.push(self.sandboxed_argv());
        a.0
    }

    /// What runs first inside the sandbox: the forwarder (with its relays, or as the
    /// sandbox's init) and then the command, or the command alone. gVisor's runtime
    /// starts the same (`crate::local::isolation::gvisor`).
    pub(crate) fn sandboxed_argv(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(r) = self.kit() {
            out.extend(r.forwarder.argv());
            for (addr, inside, _) in r.pairs() {
                out.push(format!("{addr}={inside}"));
            }
            if self.init {
                out.push("--init".into());
            }
            out.push("--".into());
        }
        out.extend(self.argv.iter().cloned());
        out
    }

    /// `/`: the image, or the host's /usr with the links and the few files of /etc
    /// programs need.
    fn root(&self, a: &mut Args) {
        match self.image {
            // The whole image, read-only; /run a tmpfs for the relays' sockets (the
            // image is read-only, so their mount points could not be made in it).
            Some(img) => {
                a.push([
                    OsStr::new("--ro-bind"),
                    img.rootfs.as_os_str(),
                    OsStr::new("/"),
                ]);
                a.push(["--tmpfs", "/run"]);
            }
            None => {
                a.push(["--ro-bind", "/usr", "/usr"]);
                for (path, link) in host_root_links() {
                    match link {
                        Some(target) => a.push([
                            OsStr::new("--symlink"),
                            target.as_os_str(),
                            path.as_os_str(),
                        ]),
                        None => {
                            a.push([OsStr::new("--ro-bind"), path.as_os_str(), path.as_os_str()]);
                        }
                    }
                }
                for path in ETC_ALWAYS {
                    a.push(["--ro-bind-try", *path, *path]);
                }
            }
        }
    }

    /// /proc, /dev, /tmp, the forwarder's kit and relays, and the workspace.
    fn mounts(&self, a: &mut Args) {
        a.push(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        // The sandbox's uid 0 is the host's root, so the kernel lets it write sysctls
        // (`kernel.core_pattern` names a program the host runs as root); bubblewrap's
        // own cover of /proc/sys is skipped when its access check says it is read-only,
        // which for this uid it wrongly does. Read-only, explicitly.
        a.push(["--ro-bind", "/proc/sys", "/proc/sys"]);
        a.push([
            "--ro-bind-try",
            "/proc/sysrq-trigger",
            "/proc/sysrq-trigger",
        ]);
        if let Some(tools) = self.tools {
            a.push([
                OsStr::new("--ro-bind"),
                tools.as_os_str(),
                OsStr::new(TOOLS),
            ]);
        }
        for t in self.toolchains {
            a.push([
                OsStr::new("--ro-bind"),
                t.dir.as_os_str(),
                OsStr::new(&t.in_sandbox()),
            ]);
        }
        if let Some(r) = self.kit() {
            a.push([
                OsStr::new("--ro-bind"),
                r.forwarder.dir.as_os_str(),
                OsStr::new(forwarder_kit::IN_SANDBOX),
            ]);
            for (_, inside, host) in r.pairs() {
                a.push([OsStr::new("--bind"), host.as_os_str(), OsStr::new(inside)]);
            }
        }
        a.push([
            OsStr::new("--bind"),
            self.workspace.as_os_str(),
            OsStr::new(WORKSPACE),
        ]);
        a.push(["--chdir", WORKSPACE, "--hostname", HOSTNAME]);
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
        // The image's own variables (its PATH first of all) over the defaults; HOME stays
        // /tmp (the image's root is read-only) and reserved names stay the provisioner's.
        if let Some(img) = self.image {
            env.extend(
                img.env
                    .iter()
                    .filter(|(k, _)| {
                        k != "HOME" && !crate::validate::RESERVED_ENV.contains(&k.as_str())
                    })
                    .cloned(),
            );
        }
        host_tools::on_path(
            &mut env,
            self.tools.is_some(),
            self.toolchains,
            self.image.is_some(),
        );
        if let Some(r) = self.relays
            && r.llm.is_some()
        {
            env.push((
                "FORKYARD_LLM_URL".into(),
                format!("http://{}", forkyard_proto::SANDBOX_LLM_ADDR),
            ));
        }
        if self.relays.is_some_and(|r| r.egress.is_some()) {
            let url = format!("http://{PROXY_ADDR}");
            for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((k.to_owned(), url.clone()));
            }
            env.push(("NO_PROXY".into(), "localhost,127.0.0.1".into()));
        }
        env.extend(self.env.iter().cloned());
        env
    }

    /// What bwrap reads from [`ENV_FD`]: NUL-separated `--clearenv`, then `--setenv NAME
    /// VALUE` for each of [`Self::env`]. Values validated to hold no NUL byte.
    pub fn env_args(&self) -> Vec<u8> {
        let mut out = b"--clearenv\0".to_vec();
        for (k, v) in self.env() {
            for part in ["--setenv", k.as_str(), v.as_str()] {
                out.extend_from_slice(part.as_bytes());
                out.push(0);
            }
        }
        out
    }

    /// The command: bubblewrap, which enters the sandbox's cgroups and drops to its uid
    /// between fork and exec (`super::enter`), started with an empty environment; the
    /// sandboxed command's environment reaches bwrap on [`ENV_FD`] (a memfd, so values are
    /// never on a command line or on disk).
    pub fn command(&self) -> std::io::Result<Command> {
        // The uid drop comes after the cgroup join (writing the join files takes the
        // provisioner's rights) and before bubblewrap, so its user namespace maps the
        // sandbox to the dropped uid.
        let mut cmd = Command::new(self.bwrap);
        enter::set(&mut cmd, self.cgroup_joins, self.attach()?, self.uid)?;
        cmd.env_clear().args(self.args());
        let fds: Vec<FdMapping> = self
            .bwrap_fds()?
            .into_iter()
            .map(|(parent_fd, child_fd)| FdMapping {
                parent_fd,
                child_fd,
            })
            .collect();
        let mapped: Vec<i32> = fds.iter().map(|m| m.child_fd).collect();
        cmd.fd_mappings(fds)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // After the mapping's hook: the mapped numbers and stdio are what bubblewrap keeps.
        enter::keep_only_mapped(&mut cmd, &mapped);
        // After the descriptor mapping's own hook (hooks run in the order they were
        // added): mapping needs free numbers above the others.
        enter::set_open_files_limit(&mut cmd);
        enter::set_file_size_limit(&mut cmd, self.file_size);
        Ok(cmd)
    }

    /// The overlay to attach in the child (`super::enter::attach`): a descriptor
    /// of the mount of its own (close-on-exec) and the mount point.
    pub(crate) fn attach(
        &self,
    ) -> std::io::Result<Option<(std::os::fd::OwnedFd, std::ffi::CString)>> {
        let Some(mount) = self.overlay else {
            return Ok(None);
        };
        let target = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(
            self.workspace.as_os_str(),
        ))
        .map_err(|_| std::io::Error::other("the workspace's path holds a NUL byte"))?;
        Ok(Some((mount.try_clone_to_owned()?, target)))
    }

    /// What bubblewrap reads besides its command line, and the descriptor numbers its
    /// options name: the environment ([`ENV_FD`]) and each seccomp filter.
    fn bwrap_fds(&self) -> std::io::Result<Vec<(std::os::fd::OwnedFd, i32)>> {
        let mut fds = vec![(memfd("forkyard-env", &self.env_args())?, ENV_FD)];
        for (filter, fd) in self.seccomp.iter().zip(SECCOMP_FD..) {
            fds.push((memfd("forkyard-seccomp", filter)?, fd));
        }
        Ok(fds)
    }

    /// Start the sandbox's init as [`Self::command`] would, without a fork of the
    /// provisioner ([`super::vfork`]): `stdin` its descriptor 0, `stderr` its 2,
    /// /dev/null its 1.
    pub(crate) fn spawn_init(
        &self,
        stdin: std::os::fd::OwnedFd,
        stderr: std::os::fd::OwnedFd,
    ) -> std::io::Result<vfork::Process> {
        use std::os::unix::ffi::OsStrExt;
        let c = |s: &OsStr| {
            std::ffi::CString::new(s.as_bytes()).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} holds a NUL byte", s.to_string_lossy()),
                )
            })
        };
        let program = c(self.bwrap.as_os_str())?;
        let mut argv = vec![program.clone()];
        for a in self.args() {
            argv.push(c(&a)?);
        }
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let mut fds = vec![(stdin, 0), (null, 1), (stderr, 2)];
        fds.extend(self.bwrap_fds()?);
        vfork::spawn(vfork::Plan {
            program,
            argv,
            env: Vec::new(),
            fds,
            procs: enter::open_joins(self.cgroup_joins)?,
            attach: self.attach()?,
            binds: Vec::new(),
            ids: self.uid.map(|u| (u, u)),
            nofile: open_files::for_sandbox(),
            fsize: self.file_size,
        })
    }
}

/// An anonymous in-memory file holding `data`, positioned at its start. Close-on-exec
/// here: only the one child it is mapped into gets it, never a concurrently spawned one.
fn memfd(name: &str, data: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::io::{Seek, Write};
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(data)?;
    file.rewind()?;
    Ok(file.into())
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
pub(crate) fn host_root_links() -> &'static [(PathBuf, Option<PathBuf>)] {
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

#[cfg(test)]
#[path = "bwrap_tests.rs"]
mod tests;
