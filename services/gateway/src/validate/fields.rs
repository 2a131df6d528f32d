//! Checks of single fields of a `LaunchRun` request, each refusal naming its field.

use crate::error::GatewayError;
use std::collections::HashMap;

/// The agent's and the verify command's longest command line.
const MAX_COMMAND_BYTES: usize = 16 << 10;
const MAX_FORK_TIMEOUT_SECS: u32 = 24 * 3600;
const MAX_LABELS: usize = 64;

pub(super) fn field(name: &str, msg: impl std::fmt::Display) -> GatewayError {
    GatewayError::field(name, msg)
}

/// A conservative subset of git's ref rules, so every `<branch>-fork-<n>` is valid too.
pub(super) fn check_branch(branch: &str) -> Result<(), GatewayError> {
    let component_ok = |c: &str| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock");
    let ok = branch.len() <= 100
        && !branch.starts_with(['-', '/'])
        && !branch.ends_with(['/', '.'])
        && !branch.contains("..")
        && branch.split('/').all(component_ok)
        && branch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(field(
            "branch",
            format!("{branch:?} is not a valid git branch name"),
        ))
    }
}

/// A commit-ish git could read: no option look-alike, no whitespace or control
/// characters (whether it names a commit is asked of the repository: [`check_repo`]).
///
/// [`check_repo`]: crate::repo_check::check_repo
pub(crate) fn check_base_ref(base_ref: &str) -> Result<(), GatewayError> {
    let ok = base_ref.len() <= 256
        && !base_ref.starts_with('-')
        && !base_ref
            .chars()
            .any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(field(
            "base_ref",
            format!("{base_ref:?} is not a commit, branch or tag name"),
        ))
    }
}

/// Text that travels into a sandbox or a command line cannot hold NUL bytes.
pub(super) fn no_nul(name: &str, value: &str) -> Result<(), GatewayError> {
    if value.contains('\0') {
        Err(field(name, "contains a NUL byte"))
    } else {
        Ok(())
    }
}

/// A command line no longer than [`MAX_COMMAND_BYTES`].
pub(super) fn command_size(name: &str, command: &str) -> Result<(), GatewayError> {
    if command.len() > MAX_COMMAND_BYTES {
        return Err(field(
            name,
            format!(
                "is {} bytes; the limit is {MAX_COMMAND_BYTES}",
                command.len()
            ),
        ));
    }
    Ok(())
}

/// A timeout in seconds: 0 is `default`, at most a day.
pub(super) fn timeout_secs(name: &str, secs: u32, default: u32) -> Result<u32, GatewayError> {
    match secs {
        0 => Ok(default),
        t if t > MAX_FORK_TIMEOUT_SECS => Err(field(
            name,
            format!("{t} is above the limit of {MAX_FORK_TIMEOUT_SECS}"),
        )),
        t => Ok(t),
    }
}

pub(super) fn check_labels(labels: &HashMap<String, String>) -> Result<(), GatewayError> {
    if labels.len() > MAX_LABELS {
        return Err(field(
            "labels",
            format!("{} labels; the limit is {MAX_LABELS}", labels.len()),
        ));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 63
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
        let value_ok = v.len() <= 256 && !v.contains(['\0', '\'']);
        if !key_ok || !value_ok {
            return Err(field(
                "labels",
                format!(
                    "label {k:?}: keys are 1-63 characters of [A-Za-z0-9._/-], values at most 256 bytes without quotes or NUL"
                ),
            ));
        }
    }
    Ok(())
}

/// An image reference that parses; empty is the sandbox's default.
pub(super) fn check_image(image: &str) -> Result<(), GatewayError> {
    if !image.is_empty() {
        forkyard_common::image_reference::parse(image).map_err(|e| field("image", e))?;
    }
    Ok(())
}
