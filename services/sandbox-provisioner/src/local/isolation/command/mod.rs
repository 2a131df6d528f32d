//! A command of a sandbox, started and waited for the same way whatever starts it (a
//! process of the host, or the sandbox's init): `launch` starts it, `process` runs it
//! to its end with its output captured, `terminal` gives it a pty, and
//! `plain_command` starts `sh -c` of one plain command as its own words.

pub(crate) mod launch;
pub(crate) mod plain_command;
pub(crate) mod process;
pub(crate) mod terminal;
