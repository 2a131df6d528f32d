//! Checks on request fields that the types do not enforce.

use crate::{
    bwrap,
    error::{ProvisionerError, Result},
};
pub(crate) fn argv(argv: &[String]) -> Result<()> {
    if argv.first().is_none_or(String::is_empty) {
        return Err(ProvisionerError::invalid("argv", "must name a command"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ProvisionerError::invalid(
            "argv",
            "must not contain NUL bytes",
        ));
    }
    Ok(())
}

pub(crate) fn env(name: &str, value: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(ProvisionerError::invalid(
            "env",
            format!("{name:?} is not a valid variable name"),
        ));
    }
    if bwrap::RESERVED_ENV.contains(&name) {
        return Err(ProvisionerError::invalid(
            "env",
            format!("{name} is set by the provisioner"),
        ));
    }
    if value.contains('\0') {
        return Err(ProvisionerError::invalid(
            "env",
            format!("value of {name} contains a NUL byte"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_are_validated() {
        assert!(env("RUST_LOG", "x").is_ok());
        assert!(env("_X1", "").is_ok());
        for bad in ["", "1A", "A-B", "A=B", "FORKYARD_SANDBOX_ID"] {
            assert!(env(bad, "v").is_err(), "{bad:?} accepted");
        }
        assert!(env("A", "x\0y").is_err());
        assert!(argv(&[]).is_err());
        assert!(argv(&[String::new()]).is_err());
    }
}
