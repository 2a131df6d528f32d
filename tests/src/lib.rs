//! Helpers to boot the real mesh for end-to-end tests.
