//! Killing a started bubblewrap together with everything in its sandbox.

/// Kills the sandbox's init (bwrap's child, pid 1 of the sandbox's pid namespace, so the
/// kernel then kills everything inside) before bwrap itself. `--die-with-parent` alone is
/// not enough: under load the sandbox's init was seen outliving a SIGKILLed bwrap.
pub(crate) struct KillTree(pub(crate) Option<u32>);

impl KillTree {
    pub(crate) fn kill(&mut self) {
        let Some(pid) = self.0.take() else { return };
        // Read while `pid` is unreaped, so its children's pids cannot have been reused.
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if let Some(child) = rustix::process::Pid::from_raw(child) {
                    let _ = rustix::process::kill_process(child, rustix::process::Signal::KILL);
                }
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
