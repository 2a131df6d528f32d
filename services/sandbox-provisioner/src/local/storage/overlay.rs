//! A sandbox's workspace as an overlay of its template instead of a copy: an overlayfs
//! mount whose lower layer is the template's workspace, idmapped so the sandbox's uid
//! owns what it sees, and whose upper layer (`<sandbox>/upper`) takes everything the
//! sandbox writes. A create makes the upper directory, mounts, and writes the new branch:
//! about 0.3 ms and a few inodes, where a copy cost 0.5–0.9 ms for the bench's
//! repository and 40–70 ms for a worktree of 2,000 files (docs/performance.md, "An
//! overlay workspace").
//!
//! The mount lives in no mount namespace of the host's. It is made with the new mount
//! API (`fsopen`, `fsmount`) and kept *detached*: the provisioner holds its descriptor.
//! The host reads and writes the workspace through `/proc/<provisioner>/fd/<n>/.`
//! ([`Overlays::path`]), so every host-side reader (files, patch, snapshots, disk count)
//! works unchanged. A sandbox's process gets a clone of it: the launching child makes a
//! mount namespace of its own, clones the mount (`open_tree(OPEN_TREE_CLONE)`) onto
//! `<sandbox>/workspace` there, and bubblewrap binds that as it binds a copy
//! (`crate::local::isolation::bubblewrap::enter::attach`, from `vfork` and `enter`). Nothing is in
//! the host's mount table, so a bubblewrap start does not grow with the live sandboxes,
//! and the mount goes when the provisioner's descriptor and the sandbox's processes do.
//!
//! Needs root (the uid-per-sandbox mode), and a kernel that clones a detached mount
//! (Linux 6.15 or later): [`probe`] tries it at start-up, and without it every create
//! copies, as before. One of the crate's `unsafe` places: `mount_setattr` has no
//! wrapper, and the idmap's user namespace needs a process of its own.
#![allow(unsafe_code)]

use crate::local::{
    base::fs::remove_all,
    isolation::{
        bubblewrap::{enter::attach, vfork},
        uids,
    },
    storage::layout::{UPPER, WORK, WORKSPACE},
};
use rustix::{
    fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, OpenTreeFlags},
};
use std::{
    collections::HashMap,
    ffi::{CStr, c_int, c_void},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

/// A user namespace per sandbox uid is kept for the next mount of that uid; past this
/// many, the cache starts over (uids are handed out lowest first, so the live set is
/// about the replica's concurrency).
const MAX_USERNS: usize = 4096;

/// A live overlay: its detached mount and its lower layer (the template's workspace).
struct Mounted {
    mount: Arc<OwnedFd>,
    lower: PathBuf,
}

/// The replica's live overlay workspaces, by sandbox id, and the idmaps' user namespaces.
#[derive(Default)]
pub(crate) struct Overlays {
    mounts: Mutex<HashMap<String, Mounted>>,
    userns: Mutex<HashMap<u32, Arc<OwnedFd>>>,
}

impl Overlays {
    /// Where the host reaches sandbox `id`'s workspace, if it is an overlay: the mount's
    /// root through the provisioner's descriptor (the trailing `.` lets a walk open it
    /// with `O_NOFOLLOW`, as it opens a plain workspace). Valid for the provisioner's
    /// children too, while the mount is registered.
    /// The path holds the descriptor's number: it is valid while the returned mount is
    /// held (a number closed meanwhile could be another's, another sandbox's mount).
    pub(crate) fn path(&self, id: &str) -> Option<(PathBuf, Arc<OwnedFd>)> {
        let mounts = self.mounts.lock().expect("overlays lock");
        let mount = mounts.get(id)?.mount.clone();
        let path = format!("/proc/{}/fd/{}/.", std::process::id(), mount.as_raw_fd());
        Some((PathBuf::from(path), mount))
    }

    /// The mount to give sandbox `id`'s processes, if its workspace is an overlay.
    pub(crate) fn mount_of(&self, id: &str) -> Option<Arc<OwnedFd>> {
        let mounts = self.mounts.lock().expect("overlays lock");
        mounts.get(id).map(|m| m.mount.clone())
    }

    pub(crate) fn insert(&self, id: &str, mount: OwnedFd, lower: PathBuf) {
        self.mounts.lock().expect("overlays lock").insert(
            id.to_owned(),
            Mounted {
                mount: Arc::new(mount),
                lower,
            },
        );
    }

    /// Sandbox `id`'s mount let go (its processes are gone, or its workspace replaced):
    /// the kernel frees it with the last clone.
    pub(crate) fn remove(&self, id: &str) {
        self.mounts.lock().expect("overlays lock").remove(id);
    }

    /// Whether a live overlay's lower layer is under `template` (a template directory):
    /// such a template must not be evicted.
    pub(crate) fn uses(&self, template: &Path) -> bool {
        let mounts = self.mounts.lock().expect("overlays lock");
        mounts.values().any(|m| m.lower.starts_with(template))
    }

    /// Mount an overlay of `lower` (owned on disk by the provisioner) with `sandbox`'s
    /// upper and work directories, the lower layer seen as `uid`'s; registered as
    /// sandbox `id`'s.
    pub(crate) fn mount(&self, id: &str, lower: &Path, sandbox: &Path, uid: u32) -> io::Result<()> {
        let mount = self.detached(lower, sandbox, uid)?;
        self.insert(id, mount, lower.to_path_buf());
        Ok(())
    }

    /// [`Self::mount`] not registered yet (a warm overlay, `crate::local::storage::template`'s
    /// `warm`): registered by the create that takes it.
    pub(crate) fn detached(&self, lower: &Path, sandbox: &Path, uid: u32) -> io::Result<OwnedFd> {
        let userns = self.userns(uid)?;
        mount(
            lower,
            &sandbox.join(UPPER),
            &sandbox.join(WORK),
            userns.as_fd(),
        )
    }

    /// A user namespace mapping the provisioner's uid and gid to `uid` (the idmap of a
    /// lower layer), made once per uid.
    fn userns(&self, uid: u32) -> io::Result<Arc<OwnedFd>> {
        if let Some(ns) = self.userns.lock().expect("userns lock").get(&uid) {
            return Ok(ns.clone());
        }
        let ns = Arc::new(userns_mapping_to(uid)?);
        let mut cache = self.userns.lock().expect("userns lock");
        if cache.len() >= MAX_USERNS {
            cache.clear();
        }
        cache.insert(uid, ns.clone());
        Ok(ns)
    }
}

/// A new sandbox's overlay until the sandbox is registered: dropped before (a create
/// that failed, or whose caller went), it lets the mount go and gives the uid back.
pub(crate) struct Hold {
    overlays: Arc<Overlays>,
    id: String,
    uid: Option<(u32, Arc<uids::SandboxUids>)>,
}

impl Hold {
    pub(crate) fn new(
        overlays: Arc<Overlays>,
        id: String,
        uid: Option<(u32, Arc<uids::SandboxUids>)>,
    ) -> Self {
        Self { overlays, id, uid }
    }

    /// The uid is the register's now (it gives it back if it fails).
    #[must_use]
    pub(crate) fn uid_registered(mut self) -> Self {
        self.uid = None;
        self
    }

    /// The sandbox is registered: its mount stays.
    pub(crate) fn kept(mut self) {
        self.uid = None;
        self.id.clear();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.id.is_empty() {
            self.overlays.remove(&self.id);
        }
        if let Some((uid, uids)) = self.uid.take() {
            uids.release(uid);
        }
    }
}

/// The sandbox's own layer and overlayfs's work directory, made in `sandbox` (its
/// directory): the upper layer's root is the workspace's root as the sandbox sees it,
/// its uid's alone.
pub(crate) fn make_layers(sandbox: &Path, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let upper = sandbox.join(UPPER);
    std::fs::DirBuilder::new().mode(0o700).create(&upper)?;
    uids::chown(&upper, uid)?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(sandbox.join(WORK))?;
    // The mount point the sandbox's processes get the workspace on (never mounted on
    // in the host's namespace).
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .create(sandbox.join(WORKSPACE))
    {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// What [`make_layers`] made, removed (a create that falls back to a copy).
pub(crate) fn remove_layers(sandbox: &Path) {
    for name in [UPPER, WORK, WORKSPACE] {
        let _ = remove_all(&sandbox.join(name));
    }
}

/// The overlay, detached: `lower` idmapped through `userns`, then overlayfs over it.
/// Directory renames are allowed (`redirect_dir`): without it a template's directory
/// cannot be renamed (`EXDEV`).
pub(crate) fn mount(
    lower: &Path,
    upper: &Path,
    work: &Path,
    userns: BorrowedFd<'_>,
) -> io::Result<OwnedFd> {
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        lower,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| named("clone the template's tree", e))?;
    idmap(tree.as_fd(), userns).map_err(|e| named("idmap the template's tree", e))?;
    let fs = rustix::mount::fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| named("open overlayfs", e))?;
    let layer = format!("/proc/self/fd/{}", tree.as_raw_fd());
    let set = |key: &str, value: &Path| {
        rustix::mount::fsconfig_set_string(&fs, key, value)
            .map_err(|e| named(&format!("overlayfs {key}"), e))
    };
    set("lowerdir+", Path::new(&layer))?;
    set("upperdir", upper)?;
    set("workdir", work)?;
    set("redirect_dir", Path::new("on"))?;
    rustix::mount::fsconfig_create(&fs).map_err(|e| named("create the overlay", e))?;
    // No set-id program nor device node of the sandbox's means anything on it.
    let attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    rustix::mount::fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(|e| named("mount the overlay", e))
}

fn named(what: &str, e: impl Into<io::Error>) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// `mount_setattr(MOUNT_ATTR_IDMAP)` on the detached tree `tree`.
fn idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> io::Result<()> {
    /// `struct mount_attr` (linux/mount.h).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: u64::try_from(userns.as_raw_fd()).unwrap_or_default(),
    };
    // SAFETY: the system call reads `attr` (alive, of the size passed) and a NUL-
    // terminated empty path; the descriptors are open.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            std::ptr::from_ref(&attr),
            std::mem::size_of::<MountAttr>(),
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What [`userns_child`] reads: two pipe ends, as raw numbers, and the provisioner's pid.
struct UsernsCtx {
    ready: c_int,
    go: c_int,
    parent: c_int,
}

/// The child of [`userns_mapping_to`]: says it is ready, then waits to be told to exit.
extern "C" fn userns_child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `UsernsCtx` the parent keeps alive until it has reaped this
    // child. rustix's raw system calls write no errno (the memory, the C library's
    // thread state among it, is the parent's).
    unsafe {
        let ctx = &*arg.cast::<UsernsCtx>();
        // Dies with the provisioner. It holds a copy of each descriptor the provisioner
        // had (its gRPC listener among them, and the very pipe end it waits on), with its
        // signals blocked: a provisioner killed before its byte came left it waiting for
        // ever, holding the port, so the provisioner could not start again ("Address
        // already in use") and callers' connections went unanswered. A parent already
        // gone (this child reparented) ends it at once.
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
        if rustix::process::Pid::as_raw(rustix::process::getppid()) != ctx.parent {
            libc::syscall(libc::SYS_exit, 1);
        }
        let _ = rustix::io::write(BorrowedFd::borrow_raw(ctx.ready), &[1]);
        let mut b = [0u8; 1];
        let _ = rustix::io::read(BorrowedFd::borrow_raw(ctx.go), &mut b);
        libc::syscall(libc::SYS_exit, 0);
    }
    0
}

/// A new user namespace whose uid and gid of the provisioner are `uid` on the host.
/// A user namespace needs a process to be made in: a child cloned into a new one that
/// shares the provisioner's memory (`CLONE_VM`, no copy of its page tables: a fork of the
/// provisioner per uid cost a first wave of 100 creates about 100 ms), runs on a stack of
/// its own, and waits while its maps are written and its namespace is opened.
fn userns_mapping_to(uid: u32) -> io::Result<OwnedFd> {
    const STACK_BYTES: usize = 16 * 1024;
    let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (go_r, go_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let ctx = UsernsCtx {
        ready: ready_w.as_raw_fd(),
        go: go_r.as_raw_fd(),
        parent: rustix::process::getpid().as_raw_pid(),
    };
    let mut stack = vec![0u8; STACK_BYTES];
    // SAFETY: the child runs `userns_child` on `stack` with `ctx`, both alive until it is
    // reaped below, and makes raw system calls only.
    let pid = unsafe {
        vfork::clone_blocked(
            userns_child,
            &mut stack,
            libc::CLONE_VM | libc::CLONE_NEWUSER | libc::SIGCHLD,
            std::ptr::from_ref(&ctx).cast_mut().cast(),
        )
    }
    .map_err(|e| io::Error::new(e.kind(), format!("the idmap's user namespace: {e}")))?;
    drop(ready_w);
    let made = map_and_open(pid, uid, &ready_r);
    // A byte, not a close: the child holds its own copy of this end.
    let _ = rustix::io::write(&go_w, &[1]);
    let mut status = 0;
    // SAFETY: waits for our own child (it exits once told to, or is killed).
    unsafe {
        if made.is_err() {
            libc::kill(pid, libc::SIGKILL);
        }
        libc::waitpid(pid, &mut status, libc::__WALL);
    }
    drop((stack, ctx, go_r, go_w));
    made.map_err(|e| io::Error::new(e.kind(), format!("the idmap's user namespace: {e}")))
}

/// Once child `pid` says it is ready on `ready`: its user namespace's maps written
/// (the provisioner's uid and gid are `uid`), and the namespace opened.
fn map_and_open(pid: c_int, uid: u32, ready: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    if rustix::io::read(ready, &mut byte)? != 1 {
        return Err(io::Error::other("the child ended early"));
    }
    let euid = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    std::fs::write(format!("/proc/{pid}/uid_map"), format!("{euid} {uid} 1\n"))?;
    std::fs::write(format!("/proc/{pid}/gid_map"), format!("{egid} {uid} 1\n"))?;
    Ok(rustix::fs::open(
        format!("/proc/{pid}/ns/user"),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// Whether overlay workspaces work here, tried in `scratch` (made and removed here) as a
/// create and a sandbox start would use them: made as root with a lower layer of the
/// provisioner's, seen as `uid`'s, and cloned into a child's namespace. `Err`: why not.
pub(crate) fn probe(scratch: &Path, uid: u32) -> Result<(), String> {
    let _ = remove_all(scratch);
    let tried = (|| -> io::Result<()> {
        let lower = scratch.join("lower");
        std::fs::create_dir_all(lower.join("dir"))?;
        std::fs::write(lower.join("file"), "template\n")?;
        make_layers(scratch, uid)?;
        let overlays = Overlays::default();
        overlays.mount("probe", &lower, scratch, uid)?;
        let (root, _held) = overlays.path("probe").expect("just mounted");
        let meta = std::fs::metadata(root.join("file"))?;
        if std::os::unix::fs::MetadataExt::uid(&meta) != uid {
            return Err(io::Error::other(
                "the template's files are not the sandbox's",
            ));
        }
        let mount = overlays.mount_of("probe").expect("just mounted");
        let target = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(
            scratch.join(WORKSPACE).as_os_str(),
        ))
        .map_err(|_| io::Error::other("scratch path holds a NUL byte"))?;
        attached_in_a_child(mount.as_fd(), &target)
    })();
    let _ = remove_all(scratch);
    tried.map_err(|e| e.to_string())
}

/// [`attach`] in a forked child that then exits: whether it works on this kernel.
fn attached_in_a_child(mount: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    // SAFETY: the child makes raw system calls only, then `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = match attach(mount, target) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error(),
        };
        // SAFETY: ends the child.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    match libc::WEXITSTATUS(status) {
        0 if libc::WIFEXITED(status) => Ok(()),
        errno => Err(io::Error::new(
            io::Error::from_raw_os_error(errno).kind(),
            format!(
                "clone the overlay into a sandbox's namespace: {}",
                io::Error::from_raw_os_error(errno)
            ),
        )),
    }
}

#[cfg(test)]
#[path = "overlay_tests.rs"]
mod tests;
