//! The session API's verbs on the local backend, one file each, every one an
//! `impl Provisioner` over `core`: create (with its image and workspace), exec and its
//! streamed and pty kinds, the session's stop/start/persist/hydrate/fork, files,
//! patch, usage, health, destroy. `backend` serves them as a `SandboxBackend`.

pub mod backend;
pub(crate) mod create;
pub(crate) mod destroy;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod health;
pub(crate) mod patch;
pub(crate) mod pty;
pub(crate) mod sandbox_image;
pub(crate) mod session;
pub(crate) mod stream;
pub(crate) mod workspace;
