//! What a registry's manifests say: an image's config and layers, or (an index) the
//! manifest of each platform.

use crate::local::storage::image::error::ImageError;

#[derive(serde::Deserialize)]
pub(super) struct Descriptor {
    pub(super) digest: String,
    /// Its length in bytes, as the manifest says (required by the OCI and Docker specs).
    #[serde(default)]
    pub(super) size: u64,
}

#[derive(serde::Deserialize)]
pub(super) struct Manifest {
    pub(super) config: Descriptor,
    pub(super) layers: Vec<Descriptor>,
}

#[derive(serde::Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(serde::Deserialize)]
struct Listed {
    digest: String,
    platform: Option<Platform>,
}

#[derive(serde::Deserialize)]
struct IndexFile {
    manifests: Vec<Listed>,
}

/// The digest of this host's platform's manifest in an index.
pub(super) fn platform_manifest(index: &[u8]) -> Result<String, ImageError> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let index: IndexFile = serde_json::from_slice(index)
        .map_err(|e| ImageError::NotAnImage(format!("the image index: {e}")))?;
    index
        .manifests
        .into_iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .map(|m| m.digest)
        .ok_or_else(|| ImageError::NotAnImage(format!("no linux/{arch} image in the index")))
}
