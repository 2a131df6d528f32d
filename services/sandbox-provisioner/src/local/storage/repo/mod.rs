//! Repositories as host git reads them: clones (`git`), the directories a local clone
//! reads (`git_dirs`), a workspace's index and what changed in it (`git_index`,
//! `patch_scan`), and private remote repositories cloned with the tenant's credentials:
//! their templates (`remote`) and their submodules (`submodules`, `gitmodules`).

pub(crate) mod git;
pub(crate) mod git_dirs;
pub(crate) mod git_index;
pub(crate) mod gitmodules;
pub(crate) mod patch_scan;
pub(crate) mod remote;
pub(crate) mod submodules;
