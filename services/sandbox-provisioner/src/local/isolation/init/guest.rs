//! The sandbox's init, inside the sandbox's one long-lived bubblewrap: it runs each
//! command the provisioner sends it as its child, with the descriptors the provisioner
//! passed, in a process group of its own (a session of its own, the terminal its
//! controlling one, on a pty), and reports its pid and its exit. When a command's leader
//! exits, the rest of its process group is killed, as everything of a command died with
//! its own bubblewrap before. When the provisioner's end closes, every command is killed
//! and the init exits, which ends the sandbox's pid namespace and all left in it.
//!
//! The init is the namespace's pid 1 (bubblewrap's `--as-pid-1`): no reaper process of
//! bubblewrap's in front of it, and no signal from inside the sandbox reaches it (the
//! kernel drops those pid 1 has no handler for, SIGKILL included). One thread reaps
//! every child, the commands and whatever they left that was reparented to it.

use super::{
    terminal::{self, Terminals},
    wire::{self, Asked, FromInit, ToInit},
};
use rustix::{
    fd::{AsFd, OwnedFd},
    process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions, WaitStatus},
};
use std::{
    collections::HashMap,
    io::{self, Write},
    os::unix::process::{CommandExt, ExitStatusExt},
    process::{Command, ExitCode, ExitStatus, Stdio},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread,
};

/// The largest argv + environment accepted (the provisioner's own limit is 1 MiB).
const SPEC_LIMIT: u64 = 8 << 20;

/// A running command: its leader's pid, and what of it a kill reaches.
#[derive(Clone, Copy)]
struct Leader {
    pid: i32,
    /// A pty command leads a session (an interactive shell puts each job in a process
    /// group of its own): the whole session. Otherwise its process group.
    session: bool,
}

impl Leader {
    /// A running command: the leader itself too (it may have left its group, or, a pty
    /// command's helper, not made its session yet). Its pid is not reused while it is
    /// unreaped, and it is reaped only once out of the table.
    fn kill(self, sig: Signal) {
        if let Some(pid) = Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process(pid, sig);
        }
        self.kill_rest(sig);
    }

    /// What is left of a command whose leader has ended: its group (or session), killed
    /// before the leader's zombie is reaped (its pid, the group's id, is not reused
    /// while it is there).
    fn kill_rest(self, sig: Signal) {
        let Some(pid) = Pid::from_raw(self.pid) else {
            return;
        };
        let _ = rustix::process::kill_process_group(pid, sig);
        if self.session {
            kill_session(pid, sig);
        }
    }
}

/// Signal every process of the session `sid` (this sandbox's /proc lists only its own).
fn kill_session(sid: Pid, sig: Signal) {
    // A process forking meanwhile may escape one pass; a few passes catch its children.
    for _ in 0..3 {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut found = false;
        for pid in entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(Pid::from_raw)
        {
            if rustix::process::getsid(Some(pid)).is_ok_and(|s| s == sid) {
                found = true;
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
        if !found || sig != Signal::KILL {
            return;
        }
    }
}

/// Running commands: by tag, and their tags by leader pid. A leader leaves the table
/// when it has ended: what is left of its group is killed, then it is reaped (under the
/// table's lock).
#[derive(Default)]
struct Table {
    by_tag: HashMap<u64, Leader>,
    by_pid: HashMap<i32, u64>,
    /// Counts spawns: the reaper, finding no child at all, waits for it to move.
    spawns: u64,
}

#[derive(Default)]
struct Running {
    table: Mutex<Table>,
    spawned: Condvar,
    /// The terminals this init relays (gVisor's), by tag.
    terminals: Terminals,
}

impl Running {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn signal(&self, tag: u64, signal: i32) {
        let table = self.lock();
        if let (Some(leader), Some(sig)) = (table.by_tag.get(&tag), Signal::from_named_raw(signal))
        {
            leader.kill(sig);
        }
    }

    fn kill_all(&self) {
        for leader in self.lock().by_tag.values() {
            leader.kill(Signal::KILL);
        }
    }
}

/// Serve the provisioner on `sock` until it closes. `helper` starts this binary (through
/// its loader when it has one): a pty command runs under `helper --ctty -- argv`.
pub fn run(sock: OwnedFd, helper: Vec<String>) -> ExitCode {
    // Not ptrace-able, its /proc/<pid>/fd not openable, by the sandbox's other processes
    // (same uid, no capabilities): a command cannot take over the init or its pipes.
    // Its children are dumpable again at their exec.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("sandbox init: cannot make itself non-dumpable: {e}");
        return ExitCode::from(125);
    }
    let sock = Arc::new(sock);
    let running = Arc::new(Running::default());
    let (sock2, running2) = (sock.clone(), running.clone());
    if let Err(e) = thread::Builder::new()
        .name("reaper".into())
        .spawn(move || reap(&sock2, &running2))
    {
        eprintln!("sandbox init: no thread to reap its children: {e}");
        return ExitCode::from(125);
    }
    loop {
        match wire::recv::<ToInit>(sock.as_fd()) {
            Ok(Some((
                ToInit::Spawn {
                    tag,
                    pty,
                    stdin,
                    own_pty,
                    rows,
                    cols,
                    relay,
                },
                fds,
            ))) => {
                let asked = Asked {
                    tag,
                    pty,
                    stdin,
                    own_pty: pty && own_pty,
                    relay,
                    size: (rows, cols),
                };
                spawn(&sock, &running, &helper, asked, fds);
            }
            Ok(Some((ToInit::Kill { tag, signal }, _))) => running.signal(tag, signal),
            Ok(Some((ToInit::Resize { tag, rows, cols }, _))) => {
                running.terminals.resize(tag, (rows, cols));
            }
            Ok(None) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::InvalidData
                ) => {}
            Err(_) => break,
        }
    }
    running.kill_all();
    ExitCode::SUCCESS
}

fn spawn(
    sock: &Arc<OwnedFd>,
    running: &Arc<Running>,
    helper: &[String],
    asked: Asked,
    fds: Vec<OwnedFd>,
) {
    let tag = asked.tag;
    let reply = |msg: FromInit| {
        let _ = wire::send(sock.as_fd(), &msg, &[]);
    };
    let fds = if asked.own_pty {
        let own = if asked.relay {
            running.terminals.relayed(asked, fds)
        } else {
            terminal::sent_back(sock, asked, fds)
        };
        match own {
            Some(fds) => fds,
            None => return reply(FromInit::Failed { tag, code: 125 }),
        }
    } else {
        fds
    };
    let Some((spec, fds)) = received(asked, fds) else {
        return reply(FromInit::Failed { tag, code: 125 });
    };
    let Some(program) = spec.argv.first() else {
        return reply(FromInit::Failed { tag, code: 125 });
    };
    // A pty's command is started by the helper, which looks its program up itself.
    let found = (!asked.pty).then(|| on_path(program, &spec.env)).flatten();
    // Held while spawning: the reaper reaps nothing meanwhile (std reaps a child that
    // failed to exec itself, and panics if another did), and finds the pid recorded.
    let mut table = running.lock();
    let make = |found: Option<&std::path::Path>| command(helper, &spec, asked.pty, &fds, found);
    let child = match start(make, found.as_deref()) {
        Ok(child) => child,
        Err(e) => {
            drop(table);
            // Why the command could not be started, on its own stderr.
            let _ = writeln!(std::fs::File::from(fds.stderr), "forkyard: {program}: {e}");
            return reply(FromInit::Failed {
                tag,
                code: super::ctty::not_started(&e),
            });
        }
    };
    // The reaper reaps it: std's handle is never waited on.
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    drop(child);
    table.by_tag.insert(
        tag,
        Leader {
            pid,
            session: asked.pty,
        },
    );
    table.by_pid.insert(pid, tag);
    table.spawns += 1;
    running.terminals.started(tag, pid);
    // Before the lock goes: its end, which the reaper reports under it, comes after.
    reply(FromInit::Started { tag, pid });
    drop(table);
    running.spawned.notify_one();
}

/// The command `make` makes, started: as `found` on its `PATH`, else as `execvp` would.
fn start(
    make: impl Fn(Option<&std::path::Path>) -> io::Result<Command>,
    found: Option<&std::path::Path>,
) -> io::Result<std::process::Child> {
    let started = make(found).and_then(|mut c| c.spawn());
    // What `execvp` does past the first file it finds (a file without `#!` run by
    // /bin/sh, a script whose interpreter is missing passed over) std's own lookup does:
    // nothing ran, so the command is started again that way.
    if let Err(e) = &started
        && found.is_some()
        && matches!(e.raw_os_error(), Some(libc::ENOEXEC | libc::ENOENT))
    {
        return make(None).and_then(|mut c| c.spawn());
    }
    started
}

/// A command's stdin (none: /dev/null), stdout and stderr.
struct Fds {
    stdin: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// The command's spec and its stdin, stdout and stderr, out of the descriptors passed
/// with a [`ToInit::Spawn`]: the spec, then the terminal (a pty command) or stdin (when
/// asked), stdout and stderr.
fn received(asked: Asked, fds: Vec<OwnedFd>) -> Option<(wire::Spec, Fds)> {
    let mut fds = fds.into_iter();
    let spec = fds
        .next()
        .and_then(|fd| wire::read_spec(fd, SPEC_LIMIT).ok())?;
    let fds = if asked.pty {
        let tty = fds.next()?;
        Fds {
            stdin: Some(tty.try_clone().ok()?),
            stdout: tty.try_clone().ok()?,
            stderr: tty,
        }
    } else {
        let stdin = if asked.stdin { Some(fds.next()?) } else { None };
        Fds {
            stdin,
            stdout: fds.next()?,
            stderr: fds.next()?,
        }
    };
    Some((spec, fds))
}

/// The command to start: its own process group, or on a pty under `helper --ctty`, which
/// makes it a session with the terminal its controlling one. `found`: where its program
/// is, looked up already.
fn command(
    helper: &[String],
    spec: &wire::Spec,
    pty: bool,
    fds: &Fds,
    found: Option<&std::path::Path>,
) -> io::Result<Command> {
    let mut cmd = if pty {
        let mut c = Command::new(&helper[0]);
        c.args(&helper[1..]).args(["--ctty", "--"]).args(&spec.argv);
        c
    } else {
        let program = &spec.argv[0];
        let mut c = match found {
            Some(path) => {
                let mut c = Command::new(path);
                c.arg0(program);
                c
            }
            None => Command::new(program),
        };
        c.args(&spec.argv[1..]).process_group(0);
        c
    };
    let stdin = match &fds.stdin {
        Some(fd) => Stdio::from(fd.try_clone()?),
        None => Stdio::null(),
    };
    cmd.env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(stdin)
        .stdout(Stdio::from(fds.stdout.try_clone()?))
        .stderr(Stdio::from(fds.stderr.try_clone()?));
    Ok(cmd)
}

/// Where a bare command name is found on the command's own `PATH`, as `execvp` would
/// find it: the first executable regular file. Given a path, std starts the command with
/// `posix_spawn` (a `CLONE_VFORK` child sharing the init's memory); given a bare name
/// with a `PATH` of the caller's it forks the init instead (about half a millisecond a
/// command on a VM). `None` (a path already, no `PATH`, nothing found) leaves the
/// lookup, and its error, to std's `execvp`.
fn on_path(program: &str, env: &[(String, String)]) -> Option<std::path::PathBuf> {
    if program.is_empty() || program.contains('/') {
        return None;
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH")?;
    path.1.split(':').find_map(|dir| {
        // An empty entry is the working directory, as for `execvp`.
        let candidate = std::path::Path::new(if dir.is_empty() { "." } else { dir }).join(program);
        let file = std::fs::metadata(&candidate).is_ok_and(|m| m.is_file());
        (file && rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok())
            .then_some(candidate)
    })
}

/// Reap every child as it ends: for a command's leader, kill what is left of its group
/// (or session) and report its end; anything else (what a command left, reparented to
/// pid 1) is only reaped.
fn reap(sock: &OwnedFd, running: &Running) {
    loop {
        let spawns = running.lock().spawns;
        // Waits for a child to end without reaping it: reaping waits for the table.
        match rustix::process::waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOWAIT) {
            Ok(_) => {}
            Err(rustix::io::Errno::CHILD) => {
                let mut table = running.lock();
                while table.spawns == spawns {
                    table = running
                        .spawned
                        .wait(table)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                continue;
            }
            Err(_) => continue,
        }
        let mut ended = Vec::new();
        {
            let mut table = running.lock();
            while let Ok(Some(pid)) = super::ended::ended_child() {
                let leader = table
                    .by_pid
                    .remove(&pid)
                    .and_then(|tag| Some((tag, table.by_tag.remove(&tag)?)));
                // What is left of its group (or session), while its zombie holds its id.
                if let Some((_, leader)) = leader {
                    leader.kill_rest(Signal::KILL);
                }
                let Some(pid) = Pid::from_raw(pid) else {
                    continue;
                };
                let status = match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
                    Ok(Some((_, status))) => Some(status),
                    _ => None,
                };
                if let Some((tag, _)) = leader {
                    ended.push((tag, status.map_or(125, wait_code)));
                }
            }
        }
        for (tag, code) in ended {
            running.terminals.remove(tag);
            let _ = wire::send(sock.as_fd(), &FromInit::Exited { tag, code }, &[]);
        }
    }
}

/// [`code_of`] for a status from `wait`.
fn wait_code(status: WaitStatus) -> i32 {
    status
        .exit_status()
        .or_else(|| status.terminating_signal().map(|s| 128 + s))
        .unwrap_or(125)
}

/// The exit code, or 128 + the signal, as a shell (and bubblewrap) reports it.
pub fn code_of(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(125)
}
