//! What an image reference names in a registry, with Docker's defaults.

/// `registry/repository` and the tag or digest asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub repository: String,
    pub reference: String,
}

impl Target {
    /// Docker's defaults: no registry is Docker Hub, a one-part name is `library/…`,
    /// no tag is `latest`.
    pub fn parse(image: &str) -> Self {
        let (name, digest) = match image.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (image, None),
        };
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[last_slash..].rfind(':') {
            Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
            None => (name, None),
        };
        let (host, repository) = match name.split_once('/') {
            Some((h, rest)) if h.contains(['.', ':']) || h == "localhost" => {
                (h.to_owned(), rest.to_owned())
            }
            _ if name.contains('/') => ("registry-1.docker.io".into(), name.to_owned()),
            _ => ("registry-1.docker.io".into(), format!("library/{name}")),
        };
        let host = if host == "docker.io" {
            "registry-1.docker.io".into()
        } else {
            host
        };
        let reference = digest.or(tag).unwrap_or("latest").to_owned();
        Self {
            host,
            repository,
            reference,
        }
    }

    pub fn by_digest(&self) -> bool {
        self.reference.starts_with("sha256:")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_take_dockers_defaults() {
        let t = Target::parse("debian");
        assert_eq!(
            (t.host.as_str(), t.repository.as_str(), t.reference.as_str()),
            ("registry-1.docker.io", "library/debian", "latest")
        );
        let t = Target::parse("localhost:5000/forkyard/node:22");
        assert_eq!(
            (t.host.as_str(), t.repository.as_str(), t.reference.as_str()),
            ("localhost:5000", "forkyard/node", "22")
        );
        let d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let t = Target::parse(&format!("ghcr.io/org/img:1@{d}"));
        assert_eq!((t.host.as_str(), t.reference.as_str()), ("ghcr.io", d));
        assert!(t.by_digest());
        assert_eq!(Target::parse("org/img").host, "registry-1.docker.io");
    }
}
