//! Helpers the services' own tests share (feature `test-support`, for dev-dependencies).

/// Host pids whose command line contains `marker`, this process left out: what a test
/// looks for to prove that a sandbox's processes are gone.
pub fn host_pids_with(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .contains(marker)
        {
            pids.push(pid);
        }
    }
    pids
}
