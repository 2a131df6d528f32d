//! What an image archive holds, read from its unpacked files and checked against its
//! digests: an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`, as
//! `skopeo copy … oci-archive:` and Docker 25+ `docker save` write) or the older
//! `docker save` format (`manifest.json`, a config named by its digest, `<id>/layer.tar`).
//!
//! Every file is opened beneath the archive's directory with its links resolved as if
//! that directory were the root ([`confined::open_in_root`]): a `docker save` layer
//! may be a link to another's, and no link leads to a host file.

use super::{
    error::ImageError,
    layer::{self, Layer, UnpackLimits},
};
use crate::local::base::confined::{self, Tree};
use serde::Deserialize;
use std::{io::Read as _, path::Path};

/// An image's parts, every one verified but the layers' contents (checked against
/// `diff_ids` while they are applied: `super::layer`).
#[derive(Debug)]
pub struct Parts {
    /// The image's identity: the manifest's digest (OCI) or the config's (docker save,
    /// Docker's image id). `sha256:<hex>`.
    pub digest: String,
    pub config: ImageConfig,
    /// Layer files, lowest first, each with the digest of its uncompressed tar.
    pub layers: Vec<Layer>,
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
    if confined::open_in_root(dir, "index.json").is_ok() {
        read_oci(dir)
    } else if confined::open_in_root(dir, "manifest.json").is_ok() {
        read_docker_save(dir)
    } else {
        Err(ImageError::NotAnImage(
            "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)"
                .into(),
        ))
    }
}

/// The largest JSON document (index, manifest, config) read from an archive.
const MAX_JSON_BYTES: u64 = 16 << 20;

/// The file `rel` of the archive, parsed.
fn json<T: serde::de::DeserializeOwned>(dir: &Path, rel: &str) -> Result<T, ImageError> {
    parse(rel, open(dir, rel)?)
}

fn parse<T: serde::de::DeserializeOwned>(rel: &str, file: std::fs::File) -> Result<T, ImageError> {
    let mut raw = Vec::new();
    file.take(MAX_JSON_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| ImageError::NotAnImage(format!("cannot read {rel}: {e}")))?;
    serde_json::from_slice(&raw)
        .map_err(|e| ImageError::NotAnImage(format!("{rel} is not what it should be: {e}")))
}

fn open(dir: &Path, rel: &str) -> Result<std::fs::File, ImageError> {
    confined::open_in_root(dir, rel)
        .map_err(|e| ImageError::NotAnImage(format!("missing {rel}: {e}")))
}

/// `sha256:<64 hex>`, the only digest a blob may be named by (a name made of anything
/// else would be a path).
pub fn hex(digest: &str) -> Result<&str, ImageError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .ok_or_else(|| ImageError::NotAnImage(format!("unsupported digest {digest:.80}")))
}

/// A blob of an OCI layout, checked to be what its digest says.
fn blob(dir: &Path, digest: &str) -> Result<std::fs::File, ImageError> {
    let rel = format!("blobs/sha256/{}", hex(digest)?);
    verified(dir, &rel, digest)
}

/// The file `rel`, checked to hash to `digest`, read from its start.
fn verified(dir: &Path, rel: &str, digest: &str) -> Result<std::fs::File, ImageError> {
    use std::io::Seek as _;
    let mut file = open(dir, rel)?;
    let got =
        sha256(&mut file).map_err(|e| ImageError::NotAnImage(format!("cannot read {rel}: {e}")))?;
    if got != digest {
        return Err(ImageError::DigestMismatch {
            what: rel.rsplit('/').next().unwrap_or(rel).to_owned(),
            expected: digest.to_owned(),
            got,
        });
    }
    file.rewind()
        .map_err(|e| ImageError::Io(format!("read {rel}: {e}")))?;
    Ok(file)
}

fn read_oci(dir: &Path) -> Result<Parts, ImageError> {
    let index: Index = json(dir, "index.json")?;
    // One image per archive; a multi-platform index inside picks this host's platform.
    let first = index
        .manifests
        .first()
        .ok_or_else(|| ImageError::NotAnImage("index.json lists no image".into()))?;
    let mut desc_digest = first.digest.clone();
    if first.media_type.contains("index") {
        let inner: Index = parse("the image index", blob(dir, &first.digest)?)?;
        desc_digest = inner
            .manifests
            .first()
            .ok_or_else(|| ImageError::NotAnImage("an empty image index".into()))?
            .digest
            .clone();
    }
    let manifest: Manifest = parse("the manifest", blob(dir, &desc_digest)?)?;
    let config_file: ConfigFile = parse("the config", blob(dir, &manifest.config.digest)?)?;
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
    layers: Vec<std::fs::File>,
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
        layers: layers
            .into_iter()
            .zip(diff_ids)
            .map(|(file, diff_id)| Layer { file, diff_id })
            .collect(),
    })
}

fn read_docker_save(dir: &Path) -> Result<Parts, ImageError> {
    let saved: Vec<SavedImage> = json(dir, "manifest.json")?;
    let image = saved
        .into_iter()
        .next()
        .ok_or_else(|| ImageError::NotAnImage("manifest.json lists no image".into()))?;
    inside(&image.config)?;
    // The config is named by its digest (`<hex>.json` or `blobs/sha256/<hex>`).
    let named = image
        .config
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .trim_end_matches(".json");
    let digest = format!("sha256:{named}");
    hex(&digest)?;
    let config_file: ConfigFile = parse("the config", verified(dir, &image.config, &digest)?)?;
    let layers = image
        .layers
        .iter()
        .map(|l| inside(l).and_then(|()| open(dir, l)))
        .collect::<Result<_, _>>()?;
    assemble(digest, config_file, layers, "manifest.json")
}

/// A path an archive's manifest names, which must be a plain one inside the archive.
fn inside(rel: &str) -> Result<(), ImageError> {
    let p = Path::new(rel);
    if rel.is_empty()
        || p.components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(ImageError::NotAnImage(format!(
            "manifest.json names {rel}, outside the archive"
        )));
    }
    Ok(())
}

/// `sha256:<hex>` of a file's bytes.
fn sha256(file: &mut std::fs::File) -> std::io::Result<String> {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    std::io::copy(file, &mut hash)?;
    Ok(format!("sha256:{:x}", hash.finalize()))
}

/// Unpack the archive file `src` (a plain tar) into `dest` by descriptor, as a layer
/// is ([`layer::write_entry`]), within `limits`: its paths stay beneath `dest`, its
/// links are kept as links (read through [`confined::open_in_root`]).
pub fn unpack(
    src: &mut std::fs::File,
    dest: &Path,
    limits: UnpackLimits,
) -> Result<(), ImageError> {
    let mut tree = Tree::open(dest, false)
        .map_err(|e| ImageError::Io(format!("open the staging directory: {e}")))?;
    let not_tar = |e: std::io::Error| ImageError::NotAnImage(format!("not a tar archive: {e}"));
    let mut tar = tar::Archive::new(std::io::BufReader::new(src));
    let mut left = limits.entries;
    for entry in tar.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        left = left.checked_sub(1).ok_or_else(|| {
            ImageError::TooLarge(format!(
                "the archive has more than {} entries (FORKYARD_IMAGE_MAX_ENTRIES)",
                limits.entries
            ))
        })?;
        layer::write_entry(&mut tree, &mut entry, "the archive")?;
    }
    tree.finish()
        .map_err(|e| ImageError::NotAnImage(format!("the archive: {e}")))
}
