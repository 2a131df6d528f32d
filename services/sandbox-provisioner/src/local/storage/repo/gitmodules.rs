//! What a repository's `.gitmodules` says, read and checked before host git acts on it
//! (`crate::local::storage::repo::submodules`): the file is the repository's, so each URL, path and
//! name in it is hostile. Paths are plain relative ones, names what git accepts. A relative
//! URL (`./x`, `../x`) is resolved against the URL of the repository that names it, as
//! git does, but never climbs above that URL's host (git's own rule would turn
//! `https://h/r.git` and `../../x` into `https://x`); the result is then checked like
//! any repository's URL.

use crate::error::{ProvisionerError, Result};

/// How many submodules one workspace may have, at every level together.
pub(crate) const MAX_COUNT: usize = 50;

/// One `.gitmodules` entry with a gitlink: where, from where, at which commit.
#[derive(Debug)]
pub(crate) struct Entry {
    pub name: String,
    pub path: String,
    pub url: String,
    /// Its gitlink's (set once the tree was read).
    pub commit: String,
}

/// A submodule that cannot be used: the create fails, naming its path.
pub(crate) fn refused(path: &str, why: &str) -> ProvisionerError {
    ProvisionerError::FailedPrecondition(format!("submodule {path}: {why}"))
}

/// `git config -z` output (`key\nvalue\0`…) as submodules with a path and a URL (a
/// section with `update = none` is one git does not check out); their commits unset.
pub(crate) fn parse(listed: &str) -> Result<Vec<Entry>> {
    let mut by_name: Vec<(String, Option<String>, Option<String>, bool)> = Vec::new();
    for item in listed.split('\0').filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once('\n').unwrap_or((item, ""));
        let Some((name, var)) = key
            .strip_prefix("submodule.")
            .and_then(|k| k.rsplit_once('.'))
        else {
            continue;
        };
        let i = match by_name.iter().position(|(n, ..)| n == name) {
            Some(i) => i,
            None => {
                by_name.push((name.to_owned(), None, None, false));
                by_name.len() - 1
            }
        };
        match var {
            "path" => by_name[i].1 = Some(value.to_owned()),
            "url" => by_name[i].2 = Some(value.to_owned()),
            _ => by_name[i].3 = value == "none",
        }
    }
    let mut out = Vec::new();
    for (name, path, url, skip) in by_name {
        let (Some(path), Some(url)) = (path, url) else {
            continue;
        };
        if skip {
            continue;
        }
        let path = path.trim_end_matches('/').to_owned();
        check_path(&path).map_err(|why| refused(&path, &format!("its path {why}")))?;
        check_name(&name).map_err(|why| refused(&path, &why))?;
        out.push(Entry {
            name,
            path,
            url,
            commit: String::new(),
        });
    }
    if out.len() > MAX_COUNT {
        return Err(refused(
            &out[MAX_COUNT].path,
            &format!("more than {MAX_COUNT} submodules"),
        ));
    }
    Ok(out)
}

/// `url` as written in `.gitmodules`, absolute: a relative one resolved against
/// `base`, the URL of the repository whose `.gitmodules` names it. `Err` says why not.
pub(crate) fn resolve(base: &str, url: &str) -> Result<String, String> {
    if url.is_empty() || url.chars().any(char::is_control) {
        return Err("its URL is empty or holds control characters".into());
    }
    if !(url.starts_with("./") || url.starts_with("../")) {
        return Ok(url.to_owned());
    }
    let (prefix, path) = split(base).ok_or("its relative URL has no remote URL to go by")?;
    let lead = if path.starts_with('/') { "/" } else { "" };
    let mut parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut rest = url;
    loop {
        if let Some(r) = rest.strip_prefix("../") {
            parts
                .pop()
                .ok_or("its relative URL climbs above the repository's host")?;
            rest = r;
        } else if let Some(r) = rest.strip_prefix("./") {
            rest = r;
        } else {
            break;
        }
    }
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.split('/').any(|c| matches!(c, "" | "." | "..")) {
        return Err("its relative URL does not name a repository".into());
    }
    parts.push(rest);
    Ok(format!("{prefix}{lead}{}", parts.join("/")))
}

/// A remote URL's part that names the host, and its path: `scheme://host[:port]` and
/// `/path`, or scp-like `[user@]host:` and `path`.
fn split(base: &str) -> Option<(&str, &str)> {
    if let Some(at) = base.find("://") {
        let start = at + 3;
        let end = base[start..].find('/').map_or(base.len(), |i| start + i);
        return Some(base.split_at(end));
    }
    let colon = match base.find("]:") {
        Some(end) if base.contains('[') => end + 1,
        _ => base.find(':')?,
    };
    Some(base.split_at(colon + 1))
}

/// A submodule's path, relative to the worktree of the repository that names it: plain
/// components only (no `.`, `..`, empty one or `.git`), nothing git would not check out.
pub(crate) fn check_path(path: &str) -> Result<(), String> {
    let bad = path.is_empty()
        || path.len() > 4096
        || path.starts_with('/')
        || path.chars().any(char::is_control)
        || path
            .split('/')
            .any(|c| matches!(c, "" | "." | "..") || c.eq_ignore_ascii_case(".git"));
    if bad {
        return Err("is not a plain relative path".into());
    }
    Ok(())
}

/// A submodule's name (the key of its `.gitmodules` section, and of the settings host
/// git writes for it): git's own rule (no `..` component) and no control character.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let bad = name.is_empty()
        || name.len() > 1024
        || name.chars().any(char::is_control)
        || name.split(['/', '\\']).any(|c| c == "..");
    if bad {
        return Err("its name is not one git accepts".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitmodules_settings_become_entries() {
        let listed = "submodule.a.path\nlibs/a\0submodule.a.url\n../a.git\0\
                      submodule.b.c.path\nb\0submodule.b.c.url\nhttps://h/b.git\0\
                      submodule.skip.path\ns\0submodule.skip.url\nx\0submodule.skip.update\nnone\0\
                      submodule.nourl.path\nn\0";
        let got = parse(listed).unwrap();
        let names: Vec<_> = got.iter().map(|e| (&*e.name, &*e.path, &*e.url)).collect();
        assert_eq!(
            names,
            [("a", "libs/a", "../a.git"), ("b.c", "b", "https://h/b.git")]
        );
        let err = parse("submodule.x.path\n../out\0submodule.x.url\nu\0").unwrap_err();
        assert!(
            matches!(err, ProvisionerError::FailedPrecondition(_)),
            "{err}"
        );
        assert!(err.to_string().starts_with("submodule ../out:"), "{err}");
    }

    #[test]
    fn relative_urls_resolve_against_the_naming_repository() {
        let base = "https://git.example/org/app.git";
        for (rel, want) in [
            ("../lib.git", "https://git.example/org/lib.git"),
            ("./lib", "https://git.example/org/app.git/lib"),
            ("../../other/lib.git", "https://git.example/other/lib.git"),
            ("./../x/", "https://git.example/org/x"),
        ] {
            assert_eq!(resolve(base, rel).unwrap(), want, "{rel}");
        }
        let port = "http://127.0.0.1:8080/git/super.git/";
        assert_eq!(
            resolve(port, "../lib.git").unwrap(),
            "http://127.0.0.1:8080/git/lib.git"
        );
        assert_eq!(
            resolve("git@host:org/app.git", "../lib.git").unwrap(),
            "git@host:org/lib.git"
        );
        assert_eq!(
            resolve("git@host:/srv/app.git", "../lib.git").unwrap(),
            "git@host:/srv/lib.git"
        );
        assert_eq!(
            resolve("ssh://git@h:2222/srv/a.git", "../b.git").unwrap(),
            "ssh://git@h:2222/srv/b.git"
        );
        assert_eq!(
            resolve("git@[::1]:a.git", "../b.git").unwrap(),
            "git@[::1]:b.git"
        );
    }

    #[test]
    fn relative_urls_never_leave_the_host() {
        let base = "https://git.example/app.git";
        for rel in [
            "../../evil.example/x",
            "../../../x",
            "../",
            "./",
            "../a/../b",
        ] {
            assert!(resolve(base, rel).is_err(), "{rel}");
        }
        assert!(resolve("git@host:app.git", "../../x").is_err());
        assert!(resolve("no-remote", "../x").is_err());
    }

    #[test]
    fn absolute_urls_are_kept_for_the_host_checks() {
        for url in ["https://other.example/x.git", "file:///etc", "/srv/x.git"] {
            assert_eq!(resolve("https://h/a.git", url).unwrap(), url);
        }
        assert!(resolve("https://h/a.git", "").is_err());
        assert!(resolve("https://h/a.git", "https://h/x\n.git").is_err());
    }

    #[test]
    fn paths_and_names() {
        for ok in ["lib", "libs/a", "a.b/c-d", "vendor/.hidden"] {
            assert!(check_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "/abs", "a/../b", "..", "./a", "a//b", "a/", ".git", "a/.GIT/b", "a\nb",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("libs/a").is_ok());
        for bad in ["", "../x", "a/../b", "a\\..\\b", "a\nb"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
