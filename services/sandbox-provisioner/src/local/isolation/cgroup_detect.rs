//! Which cgroup hierarchy to use, from the mount table (`/proc/self/mountinfo`) rather
//! than from fixed paths: hosts mount v1 controllers in different places (`cpu,cpuacct`
//! together, or apart), hybrid hosts have a controller-less v2 at
//! `/sys/fs/cgroup/unified`, and containers see their own subtree as the mount's root.

use std::path::{Path, PathBuf};

/// Controllers the provisioner needs on cgroup v2 (freezing and killing are built in).
pub const V2_CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];
/// Controllers the provisioner needs on cgroup v1, in the order `Layout::V1` holds them.
pub const V1_CONTROLLERS: &[&str] = &["memory", "pids", "cpu", "freezer"];

/// Where the hierarchy the provisioner uses is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// The unified hierarchy's mount point.
    V2 { root: PathBuf },
    /// One mount point per controller of [`V1_CONTROLLERS`], in that order.
    V1 { mounts: Vec<PathBuf> },
}

/// One cgroup mount: its mount point, and for v1 the controllers bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub point: PathBuf,
    pub v2: bool,
    pub controllers: Vec<String>,
}

/// The cgroup and cgroup2 mounts of a mountinfo text, in order.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        // "<id> <parent> <dev> <root> <point> <opts> [optional...] - <fstype> <src> <super>"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut right = right.split(' ');
        let (fstype, super_opts) = (right.next(), right.nth(1).unwrap_or(""));
        let v2 = match fstype {
            Some("cgroup2") => true,
            Some("cgroup") => false,
            _ => continue,
        };
        let controllers = if v2 {
            Vec::new()
        } else {
            super_opts
                .split(',')
                .filter(|o| !o.contains('=') && !matches!(*o, "rw" | "ro"))
                .map(str::to_owned)
                .collect()
        };
        out.push(Mount {
            point: PathBuf::from(unescape(point)),
            v2,
            controllers,
        });
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Pick the hierarchy: a v2 mount whose `cgroup.controllers` (read through
/// `controllers_of`) offers every controller of [`V2_CONTROLLERS`]; else v1 when every
/// controller of [`V1_CONTROLLERS`] is mounted; else an error saying what is missing.
pub fn choose(
    mounts: &[Mount],
    controllers_of: impl Fn(&Path) -> Option<String>,
) -> Result<Layout, String> {
    let mut v2_notes = Vec::new();
    for m in mounts.iter().filter(|m| m.v2) {
        let available = controllers_of(&m.point).unwrap_or_default();
        let available: Vec<&str> = available.split_whitespace().collect();
        let missing: Vec<&str> = V2_CONTROLLERS
            .iter()
            .copied()
            .filter(|c| !available.contains(c))
            .collect();
        if missing.is_empty() {
            return Ok(Layout::V2 {
                root: m.point.clone(),
            });
        }
        v2_notes.push(format!(
            "cgroup v2 at {} lacks {}",
            m.point.display(),
            missing.join(", ")
        ));
    }
    let mut v1 = Vec::new();
    let mut v1_missing = Vec::new();
    for c in V1_CONTROLLERS {
        match mounts
            .iter()
            .find(|m| !m.v2 && m.controllers.iter().any(|x| x == c))
        {
            Some(m) => v1.push(m.point.clone()),
            None => v1_missing.push(*c),
        }
    }
    if v1_missing.is_empty() {
        return Ok(Layout::V1 { mounts: v1 });
    }
    let mut why = v2_notes;
    if why.is_empty() {
        why.push("no cgroup v2 mount".into());
    }
    why.push(format!(
        "cgroup v1 controllers not mounted: {}",
        v1_missing.join(", ")
    ));
    Err(why.join("; "))
}

/// The layout of this host.
pub fn detect() -> Result<Layout, String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    choose(&parse_mountinfo(&text), |p| {
        std::fs::read_to_string(p.join("cgroup.controllers")).ok()
    })
}

/// The mount point of v1 controller `controller`, if it is mounted.
pub fn v1_mount_of(controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&text)
        .into_iter()
        .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
        .map(|m| m.point)
}
