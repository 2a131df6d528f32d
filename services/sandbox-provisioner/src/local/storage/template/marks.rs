//! The files that mark a template's directory: built (`ready`, naming the commit),
//! settled, and its size on the disk. Read by its build, its eviction and its warm
//! copies.

/// Present once the template is built whole; holds its commit.
pub(crate) const READY: &str = "ready";
/// Present when the template's files have their own mtimes, recorded in its index
/// (`super::settle`); a template built before that is settled at its next use.
pub(crate) const SETTLED: &str = "settled";
/// The file holding a template's size in bytes, written when it is built.
pub(crate) const BYTES: &str = "bytes";
