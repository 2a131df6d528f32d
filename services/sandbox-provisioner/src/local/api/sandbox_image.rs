//! A create's `image`: resolved to an unpacked root filesystem before anything of the
//! sandbox is made, so an image that cannot be used leaves nothing behind.

use crate::error::{ProvisionerError, Result};
use crate::local::{
    core::provisioner::Provisioner,
    storage::{
        image::{self, ImageError},
        store::SandboxImage,
    },
};
use forkyard_common::image_reference::{self as reference, Reference};

impl Provisioner {
    /// `None` for an empty `image` (the host's /usr). Errors name the image:
    /// INVALID_ARGUMENT for a malformed reference, FAILED_PRECONDITION for one this
    /// provisioner cannot use.
    pub(crate) async fn resolve_image(&self, image: &str) -> Result<Option<SandboxImage>> {
        if image.is_empty() {
            return Ok(None);
        }
        let unusable =
            |why: String| ProvisionerError::FailedPrecondition(format!("image {image}: {why}"));
        let loaded = match reference::parse(image)
            .map_err(|e| ProvisionerError::invalid("image", e))?
        {
            Reference::Archive(name) => {
                let Some(dir) = &self.config.image_archive_dir else {
                    return Err(unusable(
                        "this provisioner has no image directory (FORKYARD_IMAGE_ARCHIVE_DIR)"
                            .into(),
                    ));
                };
                let path = dir.join(&name);
                if std::fs::symlink_metadata(&path).is_err() {
                    return Err(unusable(format!("no archive {name} in {}", dir.display())));
                }
                self.storage.images.load_archive(&path).await
            }
            Reference::Registry(r) => self.storage.images.pull(&r, &self.storage.registries).await,
        }
        .map_err(|e| match e {
            ImageError::Io(why) => ProvisionerError::internal("load image", why),
            other => unusable(other.to_string()),
        })?;
        if !image::has_shell(&loaded.rootfs) {
            return Err(unusable(
                "the image has no /bin/sh (agents, verify commands and patch steps run through a shell)".into(),
            ));
        }
        let env = loaded
            .config
            .env
            .iter()
            .filter(|kv| !kv.contains('\0'))
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        self.evict_images_in_the_background();
        Ok(Some(SandboxImage {
            reference: image.to_owned(),
            digest: loaded.digest,
            rootfs: loaded.rootfs,
            env,
        }))
    }

    /// Keep the image cache within its bound (`image_cache_max_bytes`), sparing the
    /// images of this replica's sandboxes; off the create's path, and only after the
    /// cache grew (not for each of a wave's creates on an image already there).
    fn evict_images_in_the_background(&self) {
        let max = self.config.image_cache_max_bytes;
        if max == 0 || !self.storage.images.take_grown() {
            return;
        }
        let in_use: std::collections::HashSet<String> = self
            .sandboxes
            .lock()
            .expect("sandboxes lock")
            .values()
            .filter_map(|e| e.record().image.map(|i| i.digest))
            .collect();
        let images = self.storage.images.clone();
        tokio::task::spawn_blocking(move || images.evict(max, &in_use, image::evict::GRACE));
    }
}
