//! Repositories as host git reads them: clones (`git`), the directories a local clone
//! reads (`git_dirs`), a workspace's index and what changed in it (`git_index`,
//! `patch_scan`), and what a private remote repository's clone needs beyond git: its
//! refs asked with the tenant's credential (`git::ls_remote`) and its submodules
//! (`submodules`, `gitmodules`), each cloned with the tenant's credentials. The
//! templates of remote repositories are `crate::local::storage::template::remote`.

pub(crate) mod git;
pub(crate) mod git_dirs;
pub(crate) mod git_index;
pub(crate) mod gitmodules;
pub(crate) mod patch_scan;
pub(crate) mod submodules;
