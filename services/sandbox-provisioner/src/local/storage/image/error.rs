//! Why an image cannot be used.

/// Why an image cannot be used; every one names what was wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("not an image: {0}")]
    NotAnImage(String),
    #[error("digest mismatch in {what}: expected {expected}, got {got}")]
    DigestMismatch {
        what: String,
        expected: String,
        got: String,
    },
    #[error("image cache: {0}")]
    Io(String),
    /// The registry is down, refuses us, or has no such image.
    #[error("registry: {0}")]
    Registry(String),
    /// Built to reach outside the image (an entry through a link, a whiteout of `..`),
    /// or otherwise against the provisioner's policy.
    #[error("refused: {0}")]
    Refused(String),
    /// Larger than this provisioner keeps.
    #[error("too large: {0}")]
    TooLarge(String),
}
