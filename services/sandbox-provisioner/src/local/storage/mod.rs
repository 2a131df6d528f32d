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
