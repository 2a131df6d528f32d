//! What a sandbox keeps on disk: its record (`store`), its workspace (a copy of a
//! `template`, an `overlay` of one, or a clone), its `snapshot`s, its `image`, its disk
//! bound (`disk_quota`, `disk_usage`, `disk_watch`), and the repositories host git
//! reads for it (`repo`). It uses `isolation` for host uids and processes, never the
//! reverse.

pub mod disk_quota;
pub mod disk_usage;
pub(crate) mod disk_watch;
pub mod image;
pub(crate) mod layout;
pub(crate) mod overlay;
pub(crate) mod repo;
pub(crate) mod snapshot;
pub mod store;
pub(crate) mod template;

use disk_quota::DiskQuota;
use image::{ImageCache, registry::Registries};
use snapshot::Snapshots;
use std::sync::Arc;
use store::Store;
use template::Templates;

/// What the provisioner keeps on disk, as the provisioner holds it: made at start-up
/// (`crate::local::core::open`) from the settings, used by every verb.
pub struct Storage {
    /// The sandboxes' directories and records.
    pub(crate) store: Store,
    pub(crate) snapshots: Snapshots,
    pub(crate) templates: Templates,
    /// Sandbox images, unpacked once per digest (`image`).
    pub(crate) images: Arc<ImageCache>,
    pub(crate) registries: Registries,
    /// Hard disk quotas, where the state directory's filesystem offers them.
    pub(crate) disk_quota: Option<DiskQuota>,
    /// New template workspaces are overlays (`overlay`), not copies.
    pub(crate) overlay_workspaces: bool,
}
