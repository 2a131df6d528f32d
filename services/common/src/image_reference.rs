//! What a sandbox's `image` names: an archive in the provisioner's image directory, or
//! an image in an OCI registry. Checked by the gateway at launch and by the provisioner
//! at create.

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// `archive:<name>`: a file or directory directly in the image directory.
    Archive(String),
    /// `[registry/]repository[:tag][@sha256:<hex>]`, as given.
    Registry(String),
}

/// Parse `image`; the error says what is malformed (for `INVALID_ARGUMENT`).
pub fn parse(image: &str) -> Result<Reference, String> {
    if let Some(name) = image.strip_prefix("archive:") {
        return archive_name(name).map(|()| Reference::Archive(name.to_owned()));
    }
    registry_reference(image).map(|()| Reference::Registry(image.to_owned()))
}

fn archive_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "archive:{name:?}: an archive is named by a file name in the image directory (letters, digits, '.', '_', '-', '+'; not starting with '.')"
        ))
    }
}

/// The OCI distribution grammar: components of lowercase letters and digits joined by
/// separators, an optional registry host (with a '.' or ':' or `localhost`), tag and
/// digest.
fn registry_reference(image: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{image:?} is not an image reference: {why}"));
    if image.is_empty() || image.len() > 512 {
        return bad("empty or longer than 512 bytes");
    }
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let Some(hex) = d.strip_prefix("sha256:") else {
            return bad("a digest is sha256:<64 hex digits>");
        };
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return bad("a digest is sha256:<64 lowercase hex digits>");
        }
    }
    // A tag follows the last ':' after the last '/' (a registry's port comes before it).
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && !t.starts_with(['.', '-'])
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return bad("a tag is up to 128 letters, digits, '.', '_' or '-'");
        }
    }
    let mut parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 1 {
        let host = parts[0];
        if host.contains(['.', ':']) || host == "localhost" {
            let ok = host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b));
            if !ok {
                return bad("the registry is a host name with an optional port");
            }
            parts.remove(0);
        }
    }
    for p in parts {
        if !path_component(p) {
            return bad(
                "each path component is lowercase letters and digits, joined by '.', '_', '__' or '-'",
            );
        }
    }
    Ok(())
}

fn path_component(p: &str) -> bool {
    let b = p.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    let mut prev_sep = false;
    for &c in b {
        let alnum = c.is_ascii_digit() || c.is_ascii_lowercase();
        if !(alnum || b"._-".contains(&c)) {
            return false;
        }
        // "__" is allowed, other runs of separators ("..", "-.") are not; '-' may repeat.
        if !alnum && prev_sep && c != b'-' && c != b'_' {
            return false;
        }
        prev_sep = !alnum;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_and_registry_references_parse() {
        assert_eq!(
            parse("archive:node-22.tar").unwrap(),
            Reference::Archive("node-22.tar".into())
        );
        for ok in [
            "debian",
            "debian:bookworm",
            "library/debian:12.5",
            "localhost:5000/forkyard/node:22",
            "registry.example.com/a/b-c/d__e:v1.0",
            "ghcr.io/org/img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(parse(ok).unwrap(), Reference::Registry(ok.into()), "{ok}");
        }
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (bad, says) in [
            ("archive:", "file name"),
            ("archive:../etc/shadow", "file name"),
            ("archive:.hidden", "file name"),
            ("archive:a/b", "file name"),
            ("Debian", "lowercase"),
            ("debian:", "tag"),
            ("debian:-x", "tag"),
            ("a//b", "lowercase"),
            ("img@sha256:abc", "64"),
            ("img@md5:abc", "sha256"),
            ("", "empty"),
            ("host name/x", "lowercase"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
