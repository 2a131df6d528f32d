//! What an image archive holds, read from its unpacked files and checked against its
//! digests: an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`, as
//! `skopeo copy … oci-archive:` and Docker 25+ `docker save` write) or the older
//! `docker save` format (`manifest.json`, a config named by its digest, `<id>/layer.tar`).

use super::error::ImageError;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// An image's parts, every one verified but the layers' contents (checked against
/// `diff_ids` while they are applied: `super::layer`).
#[derive(Debug)]
pub struct Parts {
    /// The image's identity: the manifest's digest (OCI) or the config's (docker save,
    /// Docker's image id). `sha256:<hex>`.
    pub digest: String,
    pub config: ImageConfig,
    /// Layer files, lowest first, each with the digest of its uncompressed tar.
    pub layers: Vec<(PathBuf, String)>,
}

/// The parts of an image's config a sandbox uses.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct ImageConfig {
    #[serde(rename = "Env", default, deserialize_with = "null_as_default")]
    pub env: Vec<String>,
    #[serde(rename = "WorkingDir", default, deserialize_with = "null_as_default")]
    pub working_dir: String,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Option<ImageConfig>,
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SavedImage {
    config: String,
    layers: Vec<String>,
}

/// Read the image in the unpacked archive `dir`.
pub fn read(dir: &Path) -> Result<Parts, ImageError> {
    if dir.join("index.json").is_file() {
        read_oci(dir)
    } else if dir.join("manifest.json").is_file() {
        read_docker_save(dir)
    } else {
        Err(ImageError::NotAnImage(
            "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)"
                .into(),
        ))
    }
}

fn json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ImageError> {
    let raw = std::fs::read(path)
        .map_err(|e| ImageError::NotAnImage(format!("cannot read {}: {e}", name(path))))?;
    serde_json::from_slice(&raw).map_err(|e| {
        ImageError::NotAnImage(format!("{} is not what it should be: {e}", name(path)))
    })
}

fn name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// A blob of an OCI layout, checked to be what its digest says.
fn blob(dir: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ImageError::NotAnImage(format!("unsupported digest {digest}")))?;
    let path = dir.join("blobs/sha256").join(hex);
    verify(&path, digest)?;
    Ok(path)
}

fn verify(path: &Path, digest: &str) -> Result<(), ImageError> {
    let got = sha256_file(path)
        .map_err(|e| ImageError::NotAnImage(format!("missing {}: {e}", name(path))))?;
    if got != digest {
        return Err(ImageError::DigestMismatch {
            what: name(path),
            expected: digest.to_owned(),
            got,
        });
    }
    Ok(())
}

fn read_oci(dir: &Path) -> Result<Parts, ImageError> {
    let index: Index = json(&dir.join("index.json"))?;
    // One image per archive; a multi-platform index inside picks this host's platform.
    let first = index
        .manifests
        .first()
        .ok_or_else(|| ImageError::NotAnImage("index.json lists no image".into()))?;
    let mut desc_digest = first.digest.clone();
    if first.media_type.contains("index") {
        let inner: Index = json(&blob(dir, &first.digest)?)?;
        desc_digest = inner
            .manifests
            .first()
            .ok_or_else(|| ImageError::NotAnImage("an empty image index".into()))?
            .digest
            .clone();
    }
    let manifest: Manifest = json(&blob(dir, &desc_digest)?)?;
    let config_file: ConfigFile = json(&blob(dir, &manifest.config.digest)?)?;
    let layers = manifest
        .layers
        .iter()
        .map(|l| blob(dir, &l.digest))
        .collect::<Result<_, _>>()?;
    assemble(desc_digest, config_file, layers, "the manifest")
}

/// An image's parts, its layer files paired with the config's `diff_ids`.
fn assemble(
    digest: String,
    config_file: ConfigFile,
    layers: Vec<PathBuf>,
    listed_in: &str,
) -> Result<Parts, ImageError> {
    let diff_ids = config_file.rootfs.diff_ids;
    if diff_ids.len() != layers.len() {
        return Err(ImageError::NotAnImage(format!(
            "{listed_in} has {} layers and the config {}",
            layers.len(),
            diff_ids.len()
        )));
    }
    Ok(Parts {
        digest,
        config: config_file.config.unwrap_or_default(),
        layers: layers.into_iter().zip(diff_ids).collect(),
    })
}

fn read_docker_save(dir: &Path) -> Result<Parts, ImageError> {
    let saved: Vec<SavedImage> = json(&dir.join("manifest.json"))?;
    let image = saved
        .into_iter()
        .next()
        .ok_or_else(|| ImageError::NotAnImage("manifest.json lists no image".into()))?;
    let config_path = inside(dir, &image.config)?;
    // The config is named by its digest (`<hex>.json` or `blobs/sha256/<hex>`).
    let hex = image
        .config
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .trim_end_matches(".json");
    let digest = format!("sha256:{hex}");
    verify(&config_path, &digest)?;
    let config_file: ConfigFile = json(&config_path)?;
    let layers = image
        .layers
        .iter()
        .map(|l| inside(dir, l))
        .collect::<Result<_, _>>()?;
    assemble(digest, config_file, layers, "manifest.json")
}

/// A path an archive's manifest names, which must stay inside the archive.
fn inside(dir: &Path, rel: &str) -> Result<PathBuf, ImageError> {
    let p = Path::new(rel);
    if p.components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(ImageError::NotAnImage(format!(
            "manifest.json names {rel}, outside the archive"
        )));
    }
    Ok(dir.join(p))
}

/// `sha256:<hex>` of a file's bytes.
fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hash)?;
    Ok(format!("sha256:{:x}", hash.finalize()))
}
