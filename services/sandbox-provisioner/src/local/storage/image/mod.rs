//! Sandbox images: an OCI image's root filesystem, unpacked once per image digest into
//! a content-addressed cache (`<cache>/<hex>/rootfs`, its config in `image.json`).
//! An image is unpacked in a staging directory and renamed into place only when every
//! digest checked and every layer applied, so a half-unpacked image is never used;
//! staging left by a crash is removed when the cache opens. Loads of one archive by
//! many forks at once unpack it once.
//!
//! Sources: an image archive in the provisioner's image directory (`docker save`, or
//! an OCI layout as a directory or tar), or an OCI registry (`registry`). The cache
//! has a size bound (`evict`).
//!
//! Whoever names an image may have made it to attack the host: its archive and layers
//! are written by descriptor beneath the staging directory (`crate::local::base::confined`), on a thread
//! jailed there (`jail`), within bounds of bytes and entries (`layer::UnpackLimits`).

mod archive;
mod error;
pub(crate) mod evict;
mod jail;
mod layer;
pub mod registry;
mod rootfs;

use crate::local::{
    base::{fs::remove_all, keyed_lock},
    storage::store,
};
pub use archive::ImageConfig;
pub use error::ImageError;
pub use layer::UnpackLimits;
pub use rootfs::has_shell;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

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
    /// The root filesystem's size on disk (0 in entries from before it was kept).
    #[serde(default)]
    bytes: u64,
}

/// An archive as last seen: loaded again only when it changed.
type Seen = (PathBuf, Option<SystemTime>, u64);

/// How long a pulled tag is taken to name the same image before the registry is asked
/// again (a digest reference is never asked again).
const TAG_FRESH: std::time::Duration = std::time::Duration::from_secs(60);

pub struct ImageCache {
    root: PathBuf,
    /// One load at a time per archive.
    loading: keyed_lock::KeyedLock<PathBuf>,
    loaded: Mutex<HashMap<Seen, Image>>,
    /// One pull at a time per reference, and what each last resolved to.
    pulling: keyed_lock::KeyedLock<String>,
    pulled: Mutex<HashMap<String, (Image, std::time::Instant)>>,
    /// When each image was last handed out, for eviction.
    used: Mutex<HashMap<String, SystemTime>>,
    /// An eviction is under way (one at a time; others skip).
    evicting: std::sync::atomic::AtomicBool,
    /// An image was unpacked since [`Self::take_grown`] last asked: only then can the
    /// cache have gone past its bound.
    grown: std::sync::atomic::AtomicBool,
    /// What one image may unpack to.
    limits: UnpackLimits,
}

impl UnpackLimits {
    /// 8 GiB and a million entries: more than any toolchain image, and a bound on what
    /// a gzip bomb can fill.
    pub const DEFAULT: Self = Self {
        bytes: 8 << 30,
        entries: 1_000_000,
    };
}

impl ImageCache {
    /// The cache under `root`, without the staging directories an interrupted load
    /// left. Made 0711: a sandbox's bubblewrap, running as the sandbox's own uid, opens
    /// its image's root by path, and no uid but the provisioner's may list the cache.
    pub fn open(root: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(root)?;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711))?;
        for e in std::fs::read_dir(root)?.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = remove_all(&e.path());
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            loading: keyed_lock::KeyedLock::default(),
            loaded: Mutex::default(),
            pulling: keyed_lock::KeyedLock::default(),
            pulled: Mutex::default(),
            used: Mutex::default(),
            evicting: std::sync::atomic::AtomicBool::new(false),
            // An earlier run may have left the cache past a bound lowered since.
            grown: std::sync::atomic::AtomicBool::new(true),
            limits: UnpackLimits::DEFAULT,
        })
    }

    /// The cache with `limits` on what one image may unpack to.
    #[must_use]
    pub fn with_limits(mut self, limits: UnpackLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The image `reference` names in its registry, pulled and unpacked unless the
    /// cache has its digest; many forks asking at once pull it once.
    pub async fn pull(
        &self,
        reference: &str,
        registries: &registry::Registries,
    ) -> Result<Image, ImageError> {
        let target = registry::Target::parse(reference);
        let _one = self.pulling.lock(reference.to_owned()).await;
        let memo = self
            .pulled
            .lock()
            .expect("images lock")
            .get(reference)
            .cloned();
        if let Some((img, at)) = memo
            && (target.by_digest() || at.elapsed() < TAG_FRESH)
            && img.rootfs.is_dir()
        {
            self.touch(&img.digest);
            return Ok(img);
        }
        let staging = self
            .root
            .join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&staging).map_err(io("make a staging directory"))?;
        let layout = staging.join("layout");
        let root = self.root.clone();
        let pulled = registries
            .pull(&target, &layout, |digest| cached(&root, digest).is_some())
            .await;
        let img = match pulled {
            Ok((digest, true)) => cached(&root, &digest)
                .ok_or_else(|| ImageError::Io(format!("{digest} left the cache"))),
            Ok((_, false)) => {
                self.grew();
                let (root, staging, limits) = (root.clone(), staging.clone(), self.limits);
                tokio::task::spawn_blocking(move || {
                    load_in(&root, &staging.join("layout"), &staging, limits)
                })
                .await
                .map_err(|e| ImageError::Io(format!("load task: {e}")))
                .and_then(|r| r)
            }
            Err(e) => Err(e),
        };
        let _ = remove_all(&staging);
        let img = img?;
        self.pulled.lock().expect("images lock").insert(
            reference.to_owned(),
            (img.clone(), std::time::Instant::now()),
        );
        self.touch(&img.digest);
        Ok(img)
    }

    /// The image in the archive `path` (a tar file or an OCI layout directory),
    /// unpacked into the cache unless it is there already.
    pub async fn load_archive(&self, path: &Path) -> Result<Image, ImageError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| ImageError::NotAnImage(format!("{}: {e}", path.display())))?;
        let seen: Seen = (path.to_path_buf(), meta.modified().ok(), meta.len());
        let _one = self.loading.lock(path.to_path_buf()).await;
        let memo = self.loaded.lock().expect("images lock").get(&seen).cloned();
        if let Some(img) = memo
            && img.rootfs.is_dir()
        {
            self.touch(&img.digest);
            return Ok(img);
        }
        self.grew();
        let (root, src, limits) = (self.root.clone(), path.to_path_buf(), self.limits);
        let img = tokio::task::spawn_blocking(move || load(&root, &src, limits))
            .await
            .map_err(|e| ImageError::Io(format!("load task: {e}")))??;
        self.loaded
            .lock()
            .expect("images lock")
            .insert(seen, img.clone());
        self.touch(&img.digest);
        Ok(img)
    }
}

fn io(context: &str) -> impl Fn(std::io::Error) -> ImageError + '_ {
    move |e| ImageError::Io(format!("{context}: {e}"))
}

/// Blocking: read the archive, and unpack its image unless the cache has that digest.
fn load(root: &Path, src: &Path, limits: UnpackLimits) -> Result<Image, ImageError> {
    let staging = root.join(format!(".tmp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&staging).map_err(io("make a staging directory"))?;
    let loaded = load_in(root, src, &staging, limits);
    let _ = remove_all(&staging);
    loaded
}

fn load_in(
    root: &Path,
    src: &Path,
    staging: &Path,
    limits: UnpackLimits,
) -> Result<Image, ImageError> {
    let dir = if src.is_dir() {
        src.to_path_buf()
    } else {
        let dir = staging.join("archive");
        std::fs::create_dir(&dir).map_err(io("make a staging directory"))?;
        let mut file = std::fs::File::open(src)
            .map_err(|e| ImageError::NotAnImage(format!("{}: {e}", src.display())))?;
        jail::run(&dir, |inside| archive::unpack(&mut file, inside, limits))
            .map_err(io("start the unpack thread"))??;
        dir
    };
    let parts = archive::read(&dir)?;
    let hex = parts.digest.trim_start_matches("sha256:").to_owned();
    let home = root.join(&hex);
    if !home.join("image.json").is_file() {
        let unpacked = staging.join("image");
        let rootfs = unpacked.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(io("make a root filesystem"))?;
        let owners = rustix::process::geteuid().is_root();
        let layers = &parts.layers;
        jail::run(&rootfs, |inside| {
            layer::apply_all(layers, inside, limits, owners)?;
            rootfs::make_mount_points(inside).map_err(io("make the sandbox's mount points"))
        })
        .map_err(io("start the unpack thread"))??;
        let saved = Saved {
            digest: parts.digest.clone(),
            config: parts.config.clone(),
            bytes: store::disk_usage(&rootfs),
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

/// The image of `digest` if the cache has it unpacked.
fn cached(root: &Path, digest: &str) -> Option<Image> {
    let home = root.join(digest.trim_start_matches("sha256:"));
    let saved: Saved =
        serde_json::from_slice(&std::fs::read(home.join("image.json")).ok()?).ok()?;
    Some(Image {
        digest: saved.digest,
        rootfs: home.join("rootfs"),
        config: saved.config,
    })
}

#[cfg(test)]
mod tests;
