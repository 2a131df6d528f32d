//! Sandbox images: an OCI image's root filesystem, unpacked once per image digest into
//! a content-addressed cache (`<cache>/<hex>/rootfs`, its config in `image.json`).
//! An image is unpacked in a staging directory and renamed into place only when every
//! digest checked and every layer applied, so a half-unpacked image is never used;
//! staging left by a crash is removed when the cache opens. Loads of one archive by
//! many forks at once unpack it once.
//!
//! Sources: an image archive on the provisioner's host (`docker save`, or an OCI
//! layout as a directory or tar). Registry pulls, the sandbox's use of the root
//! filesystem and the cache's size bound are issue #23's next steps.

mod archive;
mod layer;

pub use archive::ImageConfig;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

/// Why an image cannot be used; every one names what was wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("not an image: {0}")]
    NotAnImage(String),
    #[error("digest mismatch in {what}: expected {expected}, got {got}")]
    DigestMismatch {
        what: String,
        expected: String,
        got: String,
    },
    #[error("image cache: {0}")]
    Io(String),
}

/// An image ready to be a sandbox's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `sha256:<hex>`: the manifest's digest, or the config's for a `docker save` archive.
    pub digest: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    digest: String,
    config: ImageConfig,
}

/// An archive as last seen: loaded again only when it changed.
type Seen = (PathBuf, Option<SystemTime>, u64);

pub struct ImageCache {
    root: PathBuf,
    /// One load at a time per archive.
    loading: crate::keyed_lock::KeyedLock<PathBuf>,
    loaded: Mutex<HashMap<Seen, Image>>,
}

impl ImageCache {
    /// The cache under `root` (made 0700: images may hold anything), without the
    /// staging directories an interrupted load left.
    pub fn open(root: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(root)?;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?;
        for e in std::fs::read_dir(root)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = crate::store::remove_all(&e.path());
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            loading: crate::keyed_lock::KeyedLock::default(),
            loaded: Mutex::default(),
        })
    }

    /// The image in the archive `path` (a tar file or an OCI layout directory),
    /// unpacked into the cache unless it is there already.
    pub async fn load_archive(&self, path: &Path) -> Result<Image, ImageError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| ImageError::NotAnImage(format!("{}: {e}", path.display())))?;
        let seen: Seen = (path.to_path_buf(), meta.modified().ok(), meta.len());
        let _one = self.loading.lock(path.to_path_buf()).await;
        if let Some(img) = self.loaded.lock().expect("images lock").get(&seen) {
            return Ok(img.clone());
        }
        let (root, src) = (self.root.clone(), path.to_path_buf());
        let img = tokio::task::spawn_blocking(move || load(&root, &src))
            .await
            .map_err(|e| ImageError::Io(format!("load task: {e}")))??;
        self.loaded
            .lock()
            .expect("images lock")
            .insert(seen, img.clone());
        Ok(img)
    }
}

fn io(context: &str) -> impl Fn(std::io::Error) -> ImageError + '_ {
    move |e| ImageError::Io(format!("{context}: {e}"))
}

/// Blocking: read the archive, and unpack its image unless the cache has that digest.
fn load(root: &Path, src: &Path) -> Result<Image, ImageError> {
    let staging = root.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&staging).map_err(io("make a staging directory"))?;
    let loaded = load_in(root, src, &staging);
    let _ = crate::store::remove_all(&staging);
    loaded
}

fn load_in(root: &Path, src: &Path, staging: &Path) -> Result<Image, ImageError> {
    let dir = if src.is_dir() {
        src.to_path_buf()
    } else {
        let dir = staging.join("archive");
        std::fs::create_dir(&dir).map_err(io("make a staging directory"))?;
        let file = std::fs::File::open(src)
            .map_err(|e| ImageError::NotAnImage(format!("{}: {e}", src.display())))?;
        tar::Archive::new(file).unpack(&dir).map_err(|e| {
            ImageError::NotAnImage(format!("{} is not a tar archive: {e}", src.display()))
        })?;
        dir
    };
    let parts = archive::read(&dir)?;
    let hex = parts.digest.trim_start_matches("sha256:").to_owned();
    let home = root.join(&hex);
    if !home.join("image.json").is_file() {
        let unpacked = staging.join("image");
        let rootfs = unpacked.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(io("make a root filesystem"))?;
        for (file, diff_id) in &parts.layers {
            layer::apply(file, diff_id, &rootfs)?;
        }
        let saved = Saved {
            digest: parts.digest.clone(),
            config: parts.config.clone(),
        };
        std::fs::write(
            unpacked.join("image.json"),
            serde_json::to_vec(&saved).map_err(|e| ImageError::Io(e.to_string()))?,
        )
        .map_err(io("write image.json"))?;
        // Another replica sharing the cache may have published the same digest first.
        if let Err(e) = std::fs::rename(&unpacked, &home)
            && !home.join("image.json").is_file()
        {
            return Err(ImageError::Io(format!("publish {hex}: {e}")));
        }
        tracing::info!(digest = %parts.digest, layers = parts.layers.len(), "image unpacked");
    }
    Ok(Image {
        digest: parts.digest,
        rootfs: home.join("rootfs"),
        config: parts.config,
    })
}

/// `sha256:<hex>` of a file's bytes.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hash)?;
    Ok(format!("sha256:{:x}", hash.finalize()))
}

#[cfg(test)]
mod tests;
