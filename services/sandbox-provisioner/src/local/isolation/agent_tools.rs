//! The operator's agent CLIs (`--agent-tools`, an npm prefix) where a sandbox's uid can
//! read them. A provisioner running as root gives each sandbox a host uid of its own
//! (`uids`), and that uid may not pass through the directories above the operator's
//! prefix (`/root/.cache/...`, mode 0700). Rather than open those up, the prefix is
//! mirrored into the state directory, which sandboxes already pass through: files
//! hard-linked where the filesystem allows (instant, and npm's files are world-readable
//! already), copied elsewhere; directories made 0755; links kept as links. Run by every
//! start, so an upgrade of the CLIs reaches the sandboxes.

use std::{
    io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

/// The directory to bind into sandboxes: `tools` itself when sandboxes share the
/// provisioner's uid, else its mirror under `state_dir`.
pub fn reachable(tools: &Path, state_dir: &Path, own_uids: bool) -> io::Result<PathBuf> {
    if !own_uids {
        return Ok(tools.to_owned());
    }
    let mirror = state_dir.join("agent-tools");
    if mirror.exists() {
        std::fs::remove_dir_all(&mirror)?;
    }
    mirror_tree(tools, &mirror)?;
    Ok(mirror)
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

        assert_eq!(reachable(&tools, &state, false).unwrap(), tools);
        let m = reachable(&tools, &state, true).unwrap();
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
        let m = reachable(&tools, &state, true).unwrap();
        assert!(m.join("lib/pkg/bin/new").is_file());
    }
}
