//! The operator's host directories every sandbox sees read-only: the agent CLIs
//! (`--agent-tools`, an npm prefix) and toolchains (`--toolchains`, such as the rustup
//! toolchain `cargo test` needs), where a sandbox's uid can read them. A provisioner
//! running as root gives each sandbox a host uid of its own (`uids`), and that uid may
//! not pass through the directories above the operator's (`/root/.cache/...`,
//! `/root/.rustup/...`, mode 0700). Rather than open those up, each is mirrored into the
//! state directory, which sandboxes already pass through: files hard-linked where the
//! filesystem allows (instant: a Rust toolchain's 52,000 files in 0.4 s, and their files
//! are world-readable already), copied elsewhere; directories made 0755; links kept as
//! links. Run by every start, so an upgrade reaches the sandboxes.

use std::{
    io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

/// Where the operator's agent CLIs appear in a sandbox (`--agent-tools`), read-only; its
/// `bin` is on the sandbox's PATH.
pub const TOOLS: &str = "/run/forkyard/tools";

/// Where a sandbox finds toolchain `name`: its directory, the `bin` of which goes on PATH.
pub const TOOLCHAINS: &str = "/run/forkyard/toolchains";

/// A host directory of tools (a compiler's sysroot: `bin/`, `lib/`) the operator offers
/// every sandbox under a name, at `TOOLCHAINS/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolchain {
    pub name: String,
    pub dir: PathBuf,
}

impl Toolchain {
    /// `name=/absolute/dir`, checked: a short lowercase name, an absolute directory.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let (name, dir) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?}: not name=/absolute/directory"))?;
        let good = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
        if name.is_empty() || name.len() > 32 || !name.bytes().all(good) || name.starts_with('.') {
            return Err(format!(
                "{name:?}: a toolchain's name is 1 to 32 of a-z 0-9 . _ - (not leading .)"
            ));
        }
        let dir = PathBuf::from(dir);
        if !dir.is_absolute() || !dir.is_dir() {
            return Err(format!(
                "{}: not an absolute path to a directory",
                dir.display()
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            dir,
        })
    }

    /// Where the sandbox sees it.
    pub fn in_sandbox(&self) -> String {
        format!("{TOOLCHAINS}/{}", self.name)
    }
}

/// `--agent-tools` and `--toolchains`: the host directories every sandbox sees.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HostToolsArgs {
    /// A directory of agent CLIs (an npm prefix: `bin/claude`, `bin/codex`, and what
    /// they link to), bound read-only into every sandbox at `/run/forkyard/tools`, its
    /// `bin` on the sandbox's PATH (first on the host's tools, last on an image's own).
    /// `make deps-agents` fills `~/.cache/forkyard/agents` with the pinned versions.
    #[arg(long, env = "FORKYARD_AGENT_TOOLS")]
    pub agent_tools: Option<PathBuf>,
    /// Toolchains every sandbox sees read-only, `name=/absolute/dir` separated by commas:
    /// each at `/run/forkyard/toolchains/<name>`, its `bin` on the sandbox's PATH after
    /// the agent tools (a forked repository's `cargo test` needs a Rust toolchain, and
    /// rustup's lives in the operator's home, which sandboxes do not see). `make up`
    /// offers the active rustup toolchain as `rust` when there is one.
    #[arg(long, env = "FORKYARD_TOOLCHAINS", value_delimiter = ',')]
    pub toolchains: Vec<String>,
}

impl HostToolsArgs {
    /// The agent tools directory, checked: absolute and a directory (an empty value: none).
    pub fn agent_tools(&self) -> Result<Option<PathBuf>, String> {
        let Some(dir) = self
            .agent_tools
            .as_ref()
            .filter(|d| !d.as_os_str().is_empty())
        else {
            return Ok(None);
        };
        if !dir.is_absolute() || !dir.is_dir() {
            return Err(format!(
                "--agent-tools (FORKYARD_AGENT_TOOLS) {}: not an absolute path to a directory",
                dir.display()
            ));
        }
        Ok(Some(dir.clone()))
    }

    /// The toolchains, checked: each `name=/absolute/dir`, names unique.
    pub fn toolchains(&self) -> Result<Vec<Toolchain>, String> {
        let mut out: Vec<Toolchain> = Vec::new();
        for entry in self.toolchains.iter().filter(|e| !e.trim().is_empty()) {
            let t = Toolchain::parse(entry.trim())
                .map_err(|e| format!("--toolchains (FORKYARD_TOOLCHAINS) {e}"))?;
            if out.iter().any(|o| o.name == t.name) {
                return Err(format!(
                    "--toolchains (FORKYARD_TOOLCHAINS): {} named twice",
                    t.name
                ));
            }
            out.push(t);
        }
        Ok(out)
    }
}

/// The directory to bind into sandboxes: `dir` itself when sandboxes share the
/// provisioner's uid, else its mirror at `mirror` (under the state directory).
pub fn reachable(dir: &Path, mirror: &Path, own_uids: bool) -> io::Result<PathBuf> {
    if !own_uids {
        return Ok(dir.to_owned());
    }
    if mirror.exists() {
        std::fs::remove_dir_all(mirror)?;
    }
    // A parent made here (`toolchains/`) is searchable only; one there already (the state
    // directory) keeps its mode.
    if let Some(parent) = mirror.parent().filter(|p| !p.exists()) {
        std::fs::create_dir_all(parent)?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711))?;
    }
    mirror_tree(dir, mirror)?;
    Ok(mirror.to_owned())
}

/// `from` recreated at `to`, without following any link.
fn mirror_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            mirror_tree(&src, &dst)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if kind.is_file() {
            if std::fs::hard_link(&src, &dst).is_err() {
                std::fs::copy(&src, &dst)?;
            }
            let mode = std::fs::symlink_metadata(&dst)?.permissions().mode();
            if mode & 0o004 == 0 {
                // A copy (a hard link keeps the operator's mode, world-readable from npm).
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode | 0o044))?;
            }
        }
    }
    Ok(())
}

/// The agent tools' and toolchains' `bin`s on the sandbox's PATH, in that order: first on
/// the host's tools (the operator's pinned CLIs and toolchains win over whatever /usr
/// holds), last on an image's own PATH (the image's tools win: it was chosen for them).
pub fn on_path(env: &mut [(String, String)], agents: bool, toolchains: &[Toolchain], image: bool) {
    let bins: Vec<String> = agents
        .then(|| format!("{TOOLS}/bin"))
        .into_iter()
        .chain(toolchains.iter().map(|t| format!("{}/bin", t.in_sandbox())))
        .collect();
    if bins.is_empty() {
        return;
    }
    let bins = bins.join(":");
    if let Some((_, path)) = env.iter_mut().rev().find(|(k, _)| k == "PATH") {
        *path = if image {
            format!("{path}:{bins}")
        } else {
            format!("{bins}:{path}")
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_keeps_files_links_and_modes_and_follows_no_link_out() {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("agents");
        std::fs::create_dir_all(tools.join("lib/pkg/bin")).unwrap();
        std::fs::create_dir_all(tools.join("bin")).unwrap();
        std::fs::write(tools.join("lib/pkg/bin/cli"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(
            tools.join("lib/pkg/bin/cli"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("../lib/pkg/bin/cli", tools.join("bin/cli")).unwrap();
        let outside = dir.path().join("secret");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("key"), "k").unwrap();
        std::os::unix::fs::symlink(&outside, tools.join("escape")).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).unwrap();

        let mirror = state.join("agent-tools");
        assert_eq!(reachable(&tools, &mirror, false).unwrap(), tools);
        let m = reachable(&tools, &mirror, true).unwrap();
        assert_eq!(m, state.join("agent-tools"));
        assert_eq!(
            std::fs::read_link(m.join("bin/cli")).unwrap(),
            Path::new("../lib/pkg/bin/cli")
        );
        assert_eq!(
            std::fs::read_to_string(m.join("bin/cli")).unwrap(),
            "#!/bin/sh\necho hi\n"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&m.join("lib/pkg/bin/cli")), 0o755);
        assert_eq!(mode(&m.join("lib/pkg")), 0o755);
        // The link out stays a link; nothing of its target was copied.
        assert!(
            std::fs::symlink_metadata(m.join("escape"))
                .unwrap()
                .is_symlink()
        );
        // A second start mirrors again (an upgrade reaches the sandboxes).
        std::fs::write(tools.join("lib/pkg/bin/new"), "x").unwrap();
        let m = reachable(&tools, &mirror, true).unwrap();
        assert!(m.join("lib/pkg/bin/new").is_file());
        // The state directory keeps its mode; a parent made for a mirror is searchable only.
        assert_eq!(mode(&state), 0o711);
        reachable(&tools, &state.join("toolchains/rust"), true).unwrap();
        assert_eq!(mode(&state.join("toolchains")), 0o711);
    }

    #[test]
    fn a_toolchain_is_a_short_name_and_an_absolute_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let t = Toolchain::parse(&format!("rust={d}")).unwrap();
        assert_eq!(t.in_sandbox(), "/run/forkyard/toolchains/rust");
        for bad in [
            format!("{d}"),
            format!("={d}"),
            format!("Rust={d}"),
            format!("../x={d}"),
            format!(".x={d}"),
            "rust=relative/dir".to_owned(),
            format!("rust={d}/missing"),
        ] {
            assert!(Toolchain::parse(&bad).is_err(), "{bad} accepted");
        }
    }
}
