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

/// What a test needs of its host that `make test` on CI has: a test that lacks it either
/// fails (strict) or says it did not run and returns (see [`requires`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Root: a uid per sandbox, chown, mounts, quotas.
    Root,
    /// Writable cgroups: the pids and memory limits, the kill by cgroup.
    Cgroups,
    /// Overlay workspaces: root, Linux 6.15 or later, a state directory not on overlayfs.
    Overlay,
    /// A program `make test` installs (`make deps`).
    Installed(&'static str),
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Need::Root => f.write_str("root"),
            Need::Cgroups => f.write_str("writable cgroups"),
            Need::Overlay => f.write_str("overlay workspaces"),
            Need::Installed(what) => write!(f, "{what} installed"),
        }
    }
}

/// The variable under which a missing [`Need`] fails the test instead of skipping it
/// (`make test` sets it on CI, where the host has every one).
pub const STRICT_ENV: &str = "FORKYARD_TEST_STRICT";
/// The file each skip is appended to, one line each (`make test` prints it at the end).
pub const SKIPS_ENV: &str = "FORKYARD_TEST_SKIPS";

/// Whether [`STRICT_ENV`] is set (to anything but empty or `0`).
pub fn strict() -> bool {
    std::env::var(STRICT_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // /proc/self belongs to the effective uid.
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("/proc/self")) == 0
}

/// `have`: whether the host gives the test its `need`. When it does not, under
/// [`STRICT_ENV`] the test fails here, naming what is missing; otherwise the skip is
/// recorded (stderr, and a line of [`SKIPS_ENV`]'s file) and false returned, for the
/// test to stop: `if !requires(Need::Root, is_root(), "…") { return; }`.
/// `what`: what does not run without it.
#[track_caller]
pub fn requires(need: Need, have: bool, what: &str) -> bool {
    if have {
        return true;
    }
    let test = test_name();
    if strict() {
        panic!(
            "{test}: needs {need} ({what}), which this host lacks; {STRICT_ENV} is set, so that \
             fails rather than skips"
        );
    }
    record(&format!("{test}: needs {need}: {what}"));
    false
}

/// A test (or part of one) that does not run for a fact of this host that no setting or
/// install gives (a second filesystem, how its name resolves): recorded as [`requires`]
/// does, strict or not.
pub fn skip(why: &str) {
    record(&format!("{}: {why}", test_name()));
}

fn record(line: &str) {
    use std::io::Write as _;
    eprintln!("SKIPPED {line}");
    if let Some(path) = std::env::var_os(SKIPS_ENV) {
        // One write of one line: appends from test processes running at once stay whole.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = appended {
            eprintln!("cannot record the skip in {}: {e}", path.to_string_lossy());
        }
    }
}

/// `<test binary>::<test>`: the binary's name without cargo's hash, and the test's name
/// (the test harness names each test's thread after it).
fn test_name() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.bytes().all(|b| b.is_ascii_hexdigit()) => name.to_owned(),
            _ => stem,
        })
        .unwrap_or_else(|| "?".into());
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_names_its_test_and_binary() {
        let name = test_name();
        assert!(
            name.starts_with("forkyard_common::")
                && name.ends_with("a_skip_names_its_test_and_binary"),
            "{name}"
        );
    }
}
