//! Killing a started bubblewrap together with everything in its sandbox.

use rustix::process::{Pid, Signal};

/// Kills the sandbox's init (bwrap's child, pid 1 of the sandbox's pid namespace, so the
/// kernel then kills everything inside) before bwrap itself. `--die-with-parent` alone is
/// not enough: bwrap's pid 1 asks for its parent-death signal only after it has forked
/// the command, so a bwrap killed in that window leaves pid 1 and the command running
/// for good (seen under load, about one cancel in forty).
pub(crate) struct KillTree(pub(crate) Option<u32>);

impl KillTree {
    pub(crate) fn kill(&mut self) {
        let Some(pid) = self.0.take() else { return };
        // Read while `pid` is unreaped, so its children's pids cannot have been reused.
        for child in children(pid) {
            if let Some(child) = Pid::from_raw(child) {
                let _ = rustix::process::kill_process(child, Signal::KILL);
            }
        }
    }

    /// The process exited by itself: nothing to kill, and its pid may be reused.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillTree {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `pid`'s children: from `/proc/<pid>/task/*/children` where the kernel has it
/// (`CONFIG_PROC_CHILDREN`), otherwise from every process's parent in `/proc/*/stat`
/// (a kill is rare: a cancel, a timeout, a destroy).
fn children(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => found.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return children_by_scan(pid),
            Err(_) => {}
        }
    }
    found
}

fn children_by_scan(pid: u32) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| {
            let child: i32 = p.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read(p.path().join("stat")).ok()?;
            (parent_in_stat(&stat)? == pid).then_some(child)
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: `pid (comm) state ppid ...`, where comm
/// may hold spaces and parentheses, so the fields are counted from its last `)`.
fn parent_in_stat(stat: &[u8]) -> Option<u32> {
    let after = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    std::str::from_utf8(after)
        .ok()?
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn the_parent_is_read_past_a_command_name_with_spaces_and_parentheses() {
        assert_eq!(parent_in_stat(b"42 (a) b) (c) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_in_stat(b"42 (sleep) S 1 42"), Some(1));
        assert_eq!(parent_in_stat(b"42 (broken"), None);
    }

    #[test]
    fn both_ways_find_a_shells_children() {
        // A shell with two children of its own, as bwrap has its sandbox's pid 1.
        let mut sh = Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pid = sh.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut scanned = children_by_scan(pid);
        while scanned.len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            scanned = children_by_scan(pid);
        }
        scanned.sort_unstable();
        let mut listed = children(pid);
        listed.sort_unstable();
        assert_eq!(scanned.len(), 2, "{scanned:?}");
        assert_eq!(listed, scanned);
        KillTree(Some(pid)).kill();
        for c in &scanned {
            let gone = (0..500).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                std::fs::read(format!("/proc/{c}/stat"))
                    .map_or(true, |s| s.windows(3).any(|w| w == b") Z"))
            });
            assert!(gone, "child {c} outlived the kill");
        }
        sh.kill().unwrap();
        sh.wait().unwrap();
    }
}
