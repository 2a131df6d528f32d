//! The egress forwarder as sandboxes run it: the binary with the dynamic loader and the
//! libraries it links, copied into one directory under the state directory and bound
//! read-only into each sandbox that has relays. Run through its own loader, it works on
//! any root: the host's `/usr`, or an image that has none of this host's libraries (a
//! musl image, or one without `libgcc_s`).

use crate::local::isolation::uids;
use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The directory's name inside a sandbox.
pub const IN_SANDBOX: &str = "/run/forkyard/fwd";
/// The loader's name in the kit.
const LOADER: &str = "ld.so";

#[derive(Debug, Clone)]
pub struct ForwarderKit {
    pub dir: PathBuf,
    bin_name: String,
    /// Whether the binary is dynamically linked (then started through the kit's loader).
    dynamic: bool,
    /// The libraries it links, in `ldd`'s order (the loader's `--preload`).
    libs: Vec<String>,
}

impl ForwarderKit {
    /// Copy `bin` and what it links into `dir` (made 0711; files 0755, replaced when
    /// they changed, so an upgraded binary is what sandboxes run).
    pub fn prepare(bin: &Path, dir: &Path) -> Result<Self, String> {
        let out = Command::new("ldd")
            .arg(bin)
            .output()
            .map_err(|e| format!("ldd {}: {e}", bin.display()))?;
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let copy = |from: &Path, name: &str| -> Result<(), String> {
            uids::reachable_copy(from, dir, name)
                .map(drop)
                .map_err(|e| format!("copy {}: {e}", from.display()))
        };
        let bin_name = bin.file_name().map_or_else(
            || "egress-forwarder".into(),
            |n| n.to_string_lossy().into_owned(),
        );
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        copy(bin, &bin_name)?;
        let libs = linked(&listing);
        let dynamic = out.status.success() && libs.iter().any(|(name, _)| name == LOADER);
        if dynamic {
            for (name, path) in &libs {
                copy(path, name)?;
            }
        }
        let libs = libs
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| dynamic && name != LOADER)
            .collect();
        Ok(Self {
            dir: dir.to_path_buf(),
            bin_name,
            dynamic,
            libs,
        })
    }

    /// The command prefix that starts the forwarder inside a sandbox.
    pub fn argv(&self) -> Vec<String> {
        let bin = format!("{IN_SANDBOX}/{}", self.bin_name);
        if self.dynamic {
            let mut argv = vec![
                format!("{IN_SANDBOX}/{LOADER}"),
                "--library-path".into(),
                IN_SANDBOX.into(),
            ];
            // Each library loaded by its path: found by name in the library path, the
            // loader first tries 17 hwcaps subdirectories there, each a file-server round
            // trip under gVisor (about 8 ms of CPU a sandbox start, measured).
            if !self.libs.is_empty() {
                let paths: Vec<String> = self
                    .libs
                    .iter()
                    .map(|l| format!("{IN_SANDBOX}/{l}"))
                    .collect();
                argv.extend(["--preload".into(), paths.join(" ")]);
            }
            argv.push(bin);
            argv
        } else {
            vec![bin]
        }
    }
}

/// `(name in the kit, host path)` of each library `ldd` lists, the loader as
/// [`LOADER`]: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x…)`.
fn linked(ldd: &str) -> Vec<(String, PathBuf)> {
    ldd.lines()
        .filter_map(|line| {
            let line = line.trim();
            match line.split_once(" => ") {
                Some((soname, rest)) => {
                    let path = rest.split_whitespace().next()?;
                    path.starts_with('/')
                        .then(|| (soname.trim().to_owned(), PathBuf::from(path)))
                }
                None => {
                    let path = line.split_whitespace().next()?;
                    path.starts_with('/')
                        .then(|| (LOADER.to_owned(), PathBuf::from(path)))
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_listings_name_each_library_and_the_loader() {
        let l = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x7f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n";
        assert_eq!(
            linked(l),
            vec![
                (
                    "libgcc_s.so.1".into(),
                    PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1")
                ),
                (
                    "libc.so.6".into(),
                    PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")
                ),
                (LOADER.into(), PathBuf::from("/lib64/ld-linux-x86-64.so.2")),
            ]
        );
        assert!(linked("\tnot a dynamic executable\n").is_empty());
    }

    #[test]
    fn a_kit_runs_its_binary_through_its_own_loader() {
        let dir = tempfile::tempdir().unwrap();
        let kit = ForwarderKit::prepare(Path::new("/bin/true"), &dir.path().join("kit")).unwrap();
        let argv = kit.argv();
        assert_eq!(argv[0], format!("{IN_SANDBOX}/{LOADER}"));
        // The loader and libraries run it from the kit alone.
        let local: Vec<String> = argv
            .iter()
            .map(|a| a.replace(IN_SANDBOX, &kit.dir.display().to_string()))
            .collect();
        let st = Command::new(&local[0]).args(&local[1..]).status().unwrap();
        assert!(st.success());
    }
}
