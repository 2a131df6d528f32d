//! A secret's text (a git token, a forge's API token, an installation token, a JWT):
//! read where it is needed, never printed (its `Debug` shows `Secret(…)`), and refused
//! without being quoted when a file holds something else. Below both the forge clients
//! and the credentials that hand them their tokens.

use serde::Deserialize;

/// A secret's text: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl<'de> Deserialize<'de> for Secret {
    /// Any TOML value is taken first, so that a mistyped one (a number) is refused
    /// without the parser's message quoting it.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) => Ok(Secret(s)),
            _ => Err(serde::de::Error::custom("a secret must be a string")),
        }
    }
}

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}
