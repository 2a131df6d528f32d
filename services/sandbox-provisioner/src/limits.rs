//! What both backends answer alike: the caps on what one call returns, the label that
//! filters a list by state, and the clock a sandbox's times are read from.

use std::collections::HashMap;

pub(crate) use forkyard_common::clock::now_ms;

/// Capture limit for an exec's stdout and for its stderr.
pub const OUTPUT_CAP: usize = 1024 * 1024;
/// Patch size limit when the request gives none.
pub const DEFAULT_PATCH_BYTES: u64 = 1024 * 1024;
/// Upper bound on a requested patch size, to bound memory.
pub const MAX_PATCH_BYTES: u64 = 64 * 1024 * 1024;
/// Label-selector key that filters a list of sandboxes by state.
pub const STATE_SELECTOR: &str = "forkyard.state";

/// The states a selector's [`STATE_SELECTOR`] asks for (comma-separated, any case);
/// empty: every state.
pub fn wanted_states(selector: &HashMap<String, String>) -> Vec<String> {
    selector
        .get(STATE_SELECTOR)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default()
}
