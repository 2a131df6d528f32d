//! The ground floor: what knows nothing of sandboxes, and what every floor above may
//! use. Walks and changes of a tree by descriptor (`fd_walk`, `confined`), locks
//! (`keyed_lock`, `state_lock`), a growing read buffer, a size-bounded LRU.

pub(crate) mod confined;
pub(crate) mod fd_walk;
pub(crate) mod fs;
pub(crate) mod keyed_lock;
pub(crate) mod lru;
pub(crate) mod read_buf;
pub(crate) mod shared;
pub(crate) mod state_lock;
