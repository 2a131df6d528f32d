//! Pulls from an OCI registry over the distribution API (manifests and blobs over
//! HTTP(S), with bearer-token or basic auth), written as an OCI layout that the archive
//! reader then checks like any other: every blob against its digest, the layers against
//! the config's `diff_ids`.

mod auth;
mod manifest;
mod reach;
mod target;

pub use target::Target;

use super::error::ImageError;
use auth::{error_chain, unavailable};
use forkyard_common::allowed_hosts::AllowedHosts;
use manifest::{Manifest, platform_manifest};
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt as _;

/// The setting of the registries a create may make this replica pull from, as errors
/// name it.
pub const REGISTRIES_SETTING: &str = "--allowed-registries (FORKYARD_ALLOWED_REGISTRIES)";

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// Where and how to reach registries.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// A Docker `config.json` (`{"auths": {"<host>": {"auth": "<base64 user:pass>"}}}`, as
    /// `docker login` and Kubernetes image pull secrets write it).
    pub auth_file: Option<PathBuf>,
    /// Registries reached over plain HTTP (`host[:port]`); loopback ones always are.
    pub insecure: Vec<String>,
    /// The registries (and auth services) pulls may reach (`reach`).
    pub allowed: AllowedHosts,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            auth_file: None,
            insecure: Vec::new(),
            allowed: AllowedHosts::any_public(REGISTRIES_SETTING),
        }
    }
}

/// The registry client of one provisioner.
pub struct Registries {
    http: reqwest::Client,
    /// The operator's Docker `config.json`, read at each pull (`auth::credential`).
    auth_file: Option<PathBuf>,
    insecure: Vec<String>,
    allowed: AllowedHosts,
    /// An image whose blobs add up to more is refused before any is fetched (the
    /// cache's bound: it could never be kept); 0: none.
    max_image_bytes: u64,
}

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("auth_file", &self.auth_file)
            .field("insecure", &self.insecure)
            .field("allowed", &self.allowed)
            .finish()
    }
}

/// The longest manifest or index accepted.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

impl Registries {
    pub fn new(config: &RegistryConfig, max_image_bytes: u64) -> Result<Self, String> {
        if let Some(path) = &config.auth_file {
            auth::check_file(path)?;
        }
        Ok(Self {
            http: reach::client(&config.allowed)?,
            auth_file: config.auth_file.clone(),
            insecure: config.insecure.clone(),
            allowed: config.allowed.clone(),
            max_image_bytes,
        })
    }

    fn base(&self, host: &str) -> String {
        let loopback =
            host.starts_with("localhost") || host.starts_with("127.") || host.starts_with("[::1]");
        let scheme = if loopback || self.insecure.iter().any(|h| h == host) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{host}")
    }

    /// Write the image `t` names as an OCI layout in `layout` (created), for this host's
    /// platform; returns the manifest's digest. Unless `cached(digest)` says the image
    /// is unpacked already, in which case no blob is fetched.
    pub async fn pull(
        &self,
        t: &Target,
        layout: &Path,
        cached: impl Fn(&str) -> bool,
    ) -> Result<(String, bool), ImageError> {
        let base = self.base(&t.host);
        reach::check_registry(&self.allowed, &t.host, &base)?;
        let mut session = Session {
            reg: self,
            target: t,
            base,
            token: None,
            credential: None,
        };
        let (bytes, media_type, digest) = session.platform_manifest().await?;
        if cached(&digest) {
            return Ok((digest, true));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::NotAnImage(format!("the manifest: {e}")))?;
        // Every digest is a file name below: one that is not 64 hex digits is refused
        // before anything is written (`sha256:/etc/passwd` would be a path).
        for d in std::iter::once(&manifest.config).chain(&manifest.layers) {
            super::archive::hex(&d.digest)?;
        }
        self.check_size(&manifest)?;
        let blobs = layout.join("blobs/sha256");
        tokio::fs::create_dir_all(&blobs).await.map_err(io)?;
        tokio::fs::write(blobs.join(super::archive::hex(&digest)?), &bytes)
            .await
            .map_err(io)?;
        for d in std::iter::once(&manifest.config).chain(&manifest.layers) {
            let file = blobs.join(super::archive::hex(&d.digest)?);
            session.blob(&d.digest, d.size, &file).await?;
        }
        write_index(layout, &media_type, &digest, bytes.len()).await?;
        Ok((digest, false))
    }

    /// Refused before any layer is fetched: an image larger than the whole cache.
    fn check_size(&self, manifest: &Manifest) -> Result<(), ImageError> {
        let total: u64 = std::iter::once(&manifest.config)
            .chain(&manifest.layers)
            .map(|d| d.size)
            .fold(0, u64::saturating_add);
        if self.max_image_bytes > 0 && total > self.max_image_bytes {
            return Err(ImageError::TooLarge(format!(
                "its layers are {total} bytes, more than the image cache holds ({} bytes, FORKYARD_IMAGE_CACHE_MAX_BYTES)",
                self.max_image_bytes
            )));
        }
        Ok(())
    }
}

/// The layout's `index.json` (naming the one manifest) and `oci-layout`.
async fn write_index(
    layout: &Path,
    media_type: &str,
    digest: &str,
    size: usize,
) -> Result<(), ImageError> {
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": media_type, "digest": digest, "size": size}],
    });
    tokio::fs::write(layout.join("index.json"), index.to_string())
        .await
        .map_err(io)?;
    tokio::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .await
    .map_err(io)
}

/// One pull: the token a registry's auth service gave, kept for the pull's requests.
struct Session<'a> {
    reg: &'a Registries,
    target: &'a Target,
    base: String,
    token: Option<String>,
    /// The operator's credential for the registry, read once a pull is challenged.
    credential: Option<Option<auth::Credential>>,
}

impl Session<'_> {
    /// The target's manifest, with its digest checked (when pulled by digest), and for
    /// an index the manifest of this host's platform instead, its digest checked too:
    /// (bytes, media type, digest).
    async fn platform_manifest(&mut self) -> Result<(Vec<u8>, String, String), ImageError> {
        let t = self.target;
        let (mut bytes, mut media_type) = self.manifest(&t.reference).await?;
        let mut digest = sha256(&bytes);
        if t.by_digest() && digest != t.reference {
            return Err(ImageError::DigestMismatch {
                what: "the manifest".into(),
                expected: t.reference.clone(),
                got: digest,
            });
        }
        if media_type.contains("index") || media_type.contains("manifest.list") {
            let platform = platform_manifest(&bytes)?;
            (bytes, media_type) = self.manifest(&platform).await?;
            digest = sha256(&bytes);
            if digest != platform {
                return Err(ImageError::DigestMismatch {
                    what: "the platform's manifest".into(),
                    expected: platform,
                    got: digest,
                });
            }
        }
        Ok((bytes, media_type, digest))
    }

    async fn manifest(&mut self, reference: &str) -> Result<(Vec<u8>, String), ImageError> {
        let url = format!(
            "{}/v2/{}/manifests/{reference}",
            self.base, self.target.repository
        );
        let resp = self.get(&url, Some(MANIFEST_TYPES)).await?;
        let media_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        // Manifests are a few KiB; a registry sending more is not one to unpack from.
        let mut bytes = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp.chunk().await.map_err(unavailable)? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > MAX_MANIFEST_BYTES {
                return Err(ImageError::NotAnImage(format!(
                    "the manifest {reference} is over {MAX_MANIFEST_BYTES} bytes"
                )));
            }
        }
        Ok((bytes, media_type))
    }

    /// Fetch a blob into `path`, hashing as it comes; a blob that is not what its
    /// digest says is not kept, and one longer than its descriptor's `size` (when
    /// given) is cut off there rather than filling the disk.
    async fn blob(&mut self, digest: &str, size: u64, path: &Path) -> Result<(), ImageError> {
        super::archive::hex(digest)?;
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.target.repository);
        let mut resp = self.get(&url, None).await?;
        let mut file = tokio::fs::File::create(path).await.map_err(io)?;
        let mut hash = sha2::Sha256::new();
        let mut seen: u64 = 0;
        // A descriptor without a size is held to the image's bound instead.
        let size = if size > 0 {
            size
        } else {
            self.reg.max_image_bytes
        };
        while let Some(chunk) = resp.chunk().await.map_err(unavailable)? {
            seen = seen.saturating_add(chunk.len() as u64);
            if size > 0 && seen > size {
                drop(file);
                let _ = tokio::fs::remove_file(path).await;
                return Err(ImageError::DigestMismatch {
                    what: format!("blob {digest}"),
                    expected: format!("{size} bytes"),
                    got: format!("more than {size} bytes"),
                });
            }
            hash.update(&chunk);
            file.write_all(&chunk).await.map_err(io)?;
        }
        file.flush().await.map_err(io)?;
        let got = format!("sha256:{:x}", hash.finalize());
        if got != digest {
            let _ = tokio::fs::remove_file(path).await;
            return Err(ImageError::DigestMismatch {
                what: format!("blob {digest}"),
                expected: digest.to_owned(),
                got,
            });
        }
        Ok(())
    }

    /// The credential that answers the challenge of `unauthorized` (a 401): a bearer
    /// token from the auth service the registry names, or basic auth.
    async fn answer(&mut self, unauthorized: &reqwest::Response) -> Result<String, ImageError> {
        let challenge = unauthorized
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if self.credential.is_none() {
            self.credential = Some(match &self.reg.auth_file {
                Some(file) => auth::credential(file, &self.target.host).await?,
                None => None,
            });
        }
        let credential = self.credential.as_ref().and_then(Option::as_ref);
        let (host, repository) = (&self.target.host, &self.target.repository);
        let realm = |realm: &str| reach::check_realm(&self.reg.allowed, host, &self.base, realm);
        let answer = auth::Challenge {
            host,
            repository,
            credential,
            realm: &realm,
        };
        answer.authorize(&self.reg.http, &challenge).await
    }

    /// GET with the pull's credentials; a 401 is answered once per its challenge (a
    /// bearer token from the auth service the registry names, or basic auth).
    async fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, ImageError> {
        for _ in 0..2 {
            let mut req = self.reg.http.get(url);
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            if let Some(t) = &self.token {
                req = req.header(reqwest::header::AUTHORIZATION, t);
            }
            // Why is logged, not told: the caller learns that the registry cannot be
            // reached, not what answers where (or that a name resolves to an address
            // it may not reach).
            let resp = req.send().await.map_err(|e| {
                let registry = &self.target.host;
                tracing::warn!(registry, error = %error_chain(&e), "registry cannot be reached");
                reach::unreachable_registry(registry)
            })?;
            match resp.status() {
                s if s.is_success() => return Ok(resp),
                reqwest::StatusCode::UNAUTHORIZED if self.token.is_none() => {
                    self.token = Some(self.answer(&resp).await?);
                }
                reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
                    return Err(unavailable(format!(
                        "{} refused the credentials for {}",
                        self.target.host, self.target.repository
                    )));
                }
                reqwest::StatusCode::NOT_FOUND => {
                    return Err(unavailable(format!(
                        "{} has no {}:{}",
                        self.target.host, self.target.repository, self.target.reference
                    )));
                }
                s => {
                    return Err(unavailable(format!(
                        "{} answered {s} for {url}",
                        self.target.host
                    )));
                }
            }
        }
        Err(unavailable(format!(
            "{} kept asking for credentials",
            self.target.host
        )))
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

fn io(e: std::io::Error) -> ImageError {
    ImageError::Io(format!("write the pulled image: {e}"))
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
