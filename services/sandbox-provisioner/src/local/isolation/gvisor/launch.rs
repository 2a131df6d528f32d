//! Starting a gVisor sandbox: `runsc run` of its bundle, as the sandbox's uid, in its
//! cgroups, with the workspace's overlay attached (the same child as bubblewrap's,
//! `crate::local::isolation::bubblewrap::vfork`). runsc hands its standard descriptors
//! to the container's first process, the sandbox's init: the control socket is its
//! stdin, as under bubblewrap, and the descriptors the provisioner passes on it (a
//! command's pipes, its spec) reach the init through gVisor's kernel.

use super::{bundle::Container, layout::Layout};
use crate::local::isolation::{
    bubblewrap::{bwrap::Invocation, enter, vfork},
    open_files,
};
use std::{
    ffi::CString,
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

/// How runsc is run for every sandbox.
#[derive(Debug, Clone)]
pub struct Runsc {
    pub bin: PathBuf,
    /// `--platform` (runsc's default when `None`: ptrace here, systrap on newer runsc).
    pub platform: Option<String>,
}

impl Runsc {
    /// runsc's whole argv for container `id` of `layout`. `--rootless`: runsc runs as
    /// the sandbox's uid and maps it to the container's root in a user namespace of its
    /// own; `--network=none`: gVisor's loopback only, the relays are the way out;
    /// `--host-uds=open`: the sandbox may connect to a Unix socket it sees (its relays,
    /// bound under /run/forkyard: no other mount holds one), never create one on the
    /// host; `--ignore-cgroups`: the sandbox's cgroups are joined before runsc starts.
    pub fn argv(&self, layout: &Layout, id: &str) -> Vec<String> {
        let mut argv = vec![
            self.bin.display().to_string(),
            "--rootless".into(),
            "--network=none".into(),
            "--host-uds=open".into(),
            "--ignore-cgroups".into(),
        ];
        if let Some(p) = &self.platform {
            argv.push(format!("--platform={p}"));
        }
        argv.extend([
            "--root".into(),
            layout.state().display().to_string(),
            "run".into(),
            "--bundle".into(),
            layout.bundle().display().to_string(),
            id.into(),
        ]);
        argv
    }

    /// Write `inv`'s bundle in `layout` (made afresh) and start it as container `id`,
    /// its processes at most `pids` (0: unbounded): `stdin` its descriptor 0, `stderr`
    /// its 2, /dev/null its 1.
    pub(crate) fn spawn(
        &self,
        inv: &Invocation<'_>,
        (layout, id, pids): (&Layout, &str, u64),
        stdin: OwnedFd,
        stderr: OwnedFd,
    ) -> io::Result<vfork::Process> {
        layout.reset(inv.uid)?;
        if inv.image.is_none() {
            layout.make_skeleton()?;
        }
        let container = Container {
            processes: (pids > 0).then_some(pids),
            ..Container::of(inv, &layout.skeleton(), &layout.run(), nofile())
        };
        layout.write(&container)?;
        let binds = container
            .host_binds()
            .into_iter()
            .map(|(source, target, writable)| {
                Ok(enter::HostBind {
                    source: cpath(&source)?,
                    target: cpath(&target)?,
                    writable,
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let argv = self
            .argv(layout, id)
            .into_iter()
            .map(|a| cstring(&a))
            .collect::<io::Result<Vec<_>>>()?;
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        vfork::spawn(vfork::Plan {
            program: cstring(&self.bin.display().to_string())?,
            argv,
            env: Vec::new(),
            fds: vec![(stdin, 0), (null, 1), (stderr, 2)],
            procs: enter::open_joins(inv.cgroup_joins)?,
            attach: inv.attach()?,
            binds,
            ids: inv.uid.map(|u| (u, u)),
            nofile: open_files::for_sandbox(),
            // Not on runsc: its memory file grows with the sandbox's memory. gVisor's
            // kernel holds the sandbox's processes to it (`Container::file_size`).
            fsize: None,
        })
    }
}

/// The open-files limit of the sandbox's processes: the one the replica was started with
/// (`open_files`), else the provisioner's own.
fn nofile() -> (u64, u64) {
    let l = open_files::for_sandbox()
        .unwrap_or_else(|| rustix::process::getrlimit(rustix::process::Resource::Nofile));
    let soft = l.current.unwrap_or(1 << 20);
    (soft, l.maximum.unwrap_or(soft).max(soft))
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::other(format!("{} holds a NUL byte", p.display())))
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::other(format!("{s:?} holds a NUL byte")))
}

/// Whether runsc runs a container here: `true` in a skeleton root of the host's tools,
/// under `probe_dir`, as the provisioner's uid. `Err` says why not (runsc's own last
/// words), also when it takes longer than `limit`.
pub async fn probe(
    runsc: &Runsc,
    probe_dir: &Path,
    limit: std::time::Duration,
) -> Result<(), String> {
    let layout = Layout::of_sandbox(probe_dir);
    let out = tokio::time::timeout(limit, run_probe(runsc, &layout)).await;
    let _ = crate::local::base::fs::remove_all(probe_dir);
    let bin = runsc.bin.display();
    match out {
        Ok(Ok(o)) if o.status.success() => Ok(()),
        Ok(Ok(o)) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            Err(format!(
                "{bin} cannot run a sandbox here ({}): {}",
                o.status,
                last.trim()
            ))
        }
        Ok(Err(e)) => Err(format!("{bin} cannot run a sandbox here: {e}")),
        Err(_) => Err(format!("{bin} started no sandbox within {limit:?}")),
    }
}

async fn run_probe(runsc: &Runsc, layout: &Layout) -> io::Result<std::process::Output> {
    layout.reset(None)?;
    layout.make_skeleton()?;
    let container = Container {
        root: layout.skeleton(),
        binds: vec![super::bundle::Bind {
            source: "/usr".into(),
            dest: "/usr".into(),
            writable: false,
            on_host: false,
        }],
        args: vec!["/usr/bin/true".into()],
        env: vec![("PATH".into(), "/usr/bin".into())],
        nofile: (1024, 1024),
        file_size: None,
        processes: None,
    };
    layout.write(&container)?;
    let argv = runsc.argv(layout, &format!("probe-{}", std::process::id()));
    tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
}
