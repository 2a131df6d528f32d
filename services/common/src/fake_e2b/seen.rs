//! Where a secret shows up in what the fake saw: the commands started (their arguments,
//! environment and working directory), the files written through envd, the create's
//! metadata and network rules, and every file under the live sandboxes' roots.

use super::Fake;
use std::path::Path;

impl Fake {
    /// Each place `needle` was seen, named ("command in <id>: …", "file <path>"); empty
    /// when nowhere.
    pub fn where_seen(&self, needle: &str) -> Vec<String> {
        let n = needle.as_bytes();
        let mut out = Vec::new();
        for (id, p) in self.commands.lock().unwrap().iter() {
            if p.to_string().contains(needle) {
                out.push(format!("command in {id}: {p}"));
            }
        }
        for (id, path, content) in self.files_written.lock().unwrap().iter() {
            if path.contains(needle) || contains(content, n) {
                out.push(format!("file written to {id}: {path}"));
            }
        }
        for (id, md) in self.sandboxes.lock().unwrap().iter() {
            if md
                .iter()
                .any(|(k, v)| k.contains(needle) || v.contains(needle))
            {
                out.push(format!("metadata of {id}"));
            }
        }
        for (id, net) in self.networks.lock().unwrap().iter() {
            if net.to_string().contains(needle) {
                out.push(format!("network rules of {id}"));
            }
        }
        walk(&self.root, n, &mut out);
        out
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Files under `dir` (symlinks not followed) whose name or content holds `needle`.
fn walk(dir: &Path, needle: &[u8], out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        let named = contains(e.file_name().as_encoded_bytes(), needle);
        if kind.is_dir() {
            walk(&path, needle, out);
        } else if kind.is_file()
            && (named || std::fs::read(&path).is_ok_and(|b| contains(&b, needle)))
        {
            out.push(format!("file {}", path.display()));
        } else if named {
            out.push(format!("name {}", path.display()));
        }
    }
}
