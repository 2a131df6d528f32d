//! A hold on the pushes a served bare repository receives, in its own `pre-receive`
//! hook: each push has sent its commits and waits there, its branches not yet updated,
//! until the test opens the gate. A test kills a service while its push is in flight
//! (or lets a second push catch up with the first) at a moment it chose, not by a race.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub struct PushGate {
    dir: PathBuf,
}

impl PushGate {
    /// Hold every push to the bare repository `repo` from now on. A push held five
    /// minutes, or whose gate went with the test's temp dir, fails: a test that died
    /// leaves no hook waiting forever.
    pub fn install(repo: &Path) -> PushGate {
        let dir = repo.join("push-gate");
        std::fs::create_dir_all(&dir).expect("gate dir");
        let d = dir.display();
        let hook = repo.join("hooks/pre-receive");
        let script = format!(
            "#!/bin/sh\ntouch \"{d}/held.$$\"\nn=0\nwhile [ ! -e \"{d}/open\" ] && [ ! -e \"{d}/open.$$\" ]; do\n  [ -d \"{d}\" ] && [ $n -lt 6000 ] || exit 1\n  n=$((n+1)); sleep 0.05\ndone\n"
        );
        std::fs::write(&hook, script).expect("pre-receive hook");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        PushGate { dir }
    }

    /// How many pushes reached the gate so far (held now, or let through).
    pub fn held(&self) -> usize {
        let entries = std::fs::read_dir(&self.dir).expect("gate dir");
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("held."))
            .count()
    }

    /// Wait until `n` pushes reached the gate; panics after `timeout`, naming `what`.
    pub async fn wait_held(&self, n: usize, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        while self.held() < n {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {n} pushes came",
                self.held()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Let the push that reached the gate first of those held now through alone.
    pub fn open_first(&self) {
        let entries = std::fs::read_dir(&self.dir).expect("gate dir");
        // Held now: its hook still runs (a push let through earlier has ended).
        let mut held: Vec<(std::time::SystemTime, String)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name.strip_prefix("held.")?.to_owned();
                let waits = Path::new("/proc").join(&pid).exists()
                    && !self.dir.join(format!("open.{pid}")).exists();
                let at = e.metadata().ok()?.modified().ok()?;
                waits.then_some((at, pid))
            })
            .collect();
        held.sort();
        let (_, pid) = held.first().expect("a push held");
        std::fs::write(self.dir.join(format!("open.{pid}")), "").expect("open for one");
    }

    /// Let the held pushes, and every later one, through.
    pub fn open(&self) {
        std::fs::write(self.dir.join("open"), "").expect("open the gate");
    }

    /// Hold pushes again from now on.
    pub fn close(&self) {
        let _ = std::fs::remove_file(self.dir.join("open"));
    }
}
