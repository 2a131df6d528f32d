//! What a mesh is made of on this machine: the service binaries, the agent CLIs, the
//! Temporal CLI, and free ports to run them on.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
};

/// A port free now, below the kernel's ephemeral range (32768 and up here), where the
/// outgoing connections of every test process running at the same time take theirs: a
/// port picked from that range can be taken by one of them before the service binds it.
/// A port nothing listens on, never one this process handed out before: a port picked
/// and released is free again until its service binds it, so two picks of one mesh (the
/// Temporal frontend and its UI, say) could otherwise be the same port. Nor one another
/// live test process holds ([`claim`]): a service killed and started again on its port
/// (the kill tests) left it free meanwhile, and another test's mesh took it once
/// ("Address already in use" at the restart). Two meshes that still meet on a port
/// (a process outside these tests) make [`super::Mesh::start_with`] start again.
pub(crate) fn free_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let start = RandomState::new().hash_one(std::process::id()) % u64::from(SPAN);
    let start = u16::try_from(start).unwrap_or(0);
    let port = (0..SPAN)
        .map(|i| LOW + (start + i) % SPAN)
        .find(|p| !given.contains(p) && TcpListener::bind(("127.0.0.1", *p)).is_ok() && claim(*p))
        .expect("free port");
    given.push(port);
    port
}

/// Hold `port` for this process across the test processes of the machine: a file named
/// after it holding our pid, made exclusively; one whose process is gone is taken over.
/// `false`: a live test process holds it. Where the directory cannot be made, `true`
/// (the bind check alone, as before).
fn claim(port: u16) -> bool {
    use std::io::Write as _;
    let dir = std::env::temp_dir().join("forkyard-test-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let file = dir.join(port.to_string());
    let me = std::process::id().to_string();
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file);
    match made {
        Ok(mut f) => f.write_all(me.as_bytes()).is_ok(),
        Err(_) => {
            let holder = std::fs::read_to_string(&file).unwrap_or_default();
            let alive = !holder.is_empty()
                && holder != me
                && Path::new("/proc").join(holder.trim()).exists();
            // Taken over from a process that ended (its tests are done with it).
            !alive && std::fs::write(&file, &me).is_ok()
        }
    }
}

/// Where the service binaries are.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FORKYARD_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // target/debug/deps/<test-exe> → target/debug
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The pinned agent CLIs (`make deps-agents`): `FORKYARD_AGENT_TOOLS`, else the project's
/// npm prefix `~/.cache/forkyard/agents`; what the mesh's provisioners bind into every
/// sandbox. `None` when neither exists.
pub fn agent_tools() -> Option<PathBuf> {
    let dir = std::env::var_os("FORKYARD_AGENT_TOOLS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/forkyard/agents"))
        })?;
    dir.is_dir().then_some(dir)
}

/// The Temporal CLI: `TEMPORAL_CLI`, else `temporal` on PATH.
pub fn temporal_cli() -> PathBuf {
    std::env::var_os("TEMPORAL_CLI").map_or_else(|| PathBuf::from("temporal"), PathBuf::from)
}
