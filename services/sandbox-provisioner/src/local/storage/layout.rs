//! A sandbox's directory as laid out on disk, `<state>/sandboxes/<id>/`: its record,
//! its workspace and, for an overlay workspace, overlayfs's upper and work directories.
//! The store, the overlays and the templates' warm copies each lay it out.

/// The sandbox's record, written last when it is created.
pub(crate) const RECORD: &str = "sandbox.json";
/// The sandbox's workspace: a copy or a clone, or the mount point of its overlay.
pub(crate) const WORKSPACE: &str = "workspace";
/// The sandbox's own layer, beside its record.
pub(crate) const UPPER: &str = "upper";
/// Overlayfs's work directory (the provisioner's; never seen by the sandbox).
pub(crate) const WORK: &str = "work";

/// A sandbox directory's mode (`Provisioner::sandbox_dir_mode`): others may pass
/// through only when sandboxes have uids of their own.
pub(crate) fn sandbox_dir_mode(own_uids: bool) -> u32 {
    if own_uids { 0o711 } else { 0o700 }
}
