//! Contexts, as kubectl has them: named gateways, each with its CA, API key (or a
//! command that prints it) and default output, in one TOML file, one of them current.
//!
//! ```toml
//! current-context = "prod"
//!
//! [contexts.prod]
//! gateway = "https://forkyard.example:443"
//! ca = "/home/me/forkyard-ca.pem"
//! api-key-command = "pass show forkyard/prod"
//! output = "table"
//! ```
//!
//! Each setting is its flag, else its environment variable, else the context's, else
//! the default ([`Settings::resolve`]).

use crate::output::Output;
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

pub const DEFAULT_GATEWAY: &str = "http://127.0.0.1:50051";

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Context {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
}

/// The file: `FORKYARD_CONFIG`, else `$XDG_CONFIG_HOME/forkyard/config.toml` (an
/// absolute one, as the XDG spec says), else `~/.config/forkyard/config.toml`.
pub fn path() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    path_from(var("FORKYARD_CONFIG"), var("XDG_CONFIG_HOME"), var("HOME"))
}

fn path_from(
    forkyard_config: Option<std::ffi::OsString>,
    xdg_config_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(p) = forkyard_config {
        return Some(p.into());
    }
    let base = xdg_config_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home.map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("forkyard").join("config.toml"))
}

/// The file's contexts; none when there is no file.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
        Err(e) => anyhow::bail!("{}: {e}", path.display()),
    };
    let config: Config =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for (name, c) in &config.contexts {
        anyhow::ensure!(
            c.api_key.is_none() || c.api_key_command.is_none(),
            "{}: context {name} has both api-key and api-key-command; keep one",
            path.display()
        );
    }
    Ok(config)
}

/// Written whole (comments are not kept, as kubectl does not keep them), readable by
/// its owner only, as it may hold a key; replaced at once, so a reader never sees half.
pub fn save(path: &Path, config: &Config) -> anyhow::Result<()> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let text = toml::to_string_pretty(config)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        anyhow::bail!("{}: {e}", path.display());
    }
    Ok(())
}

/// The context in effect: `--context` (FORKYARD_CONTEXT), else the file's current one;
/// none when neither names one. A name the file does not have is an error.
pub fn selected(chosen: Option<&str>) -> anyhow::Result<Option<(String, Context)>> {
    let Some(path) = path() else {
        anyhow::ensure!(chosen.is_none(), "no config file: HOME is not set");
        return Ok(None);
    };
    let mut config = load(&path)?;
    let Some(name) = chosen.map(str::to_owned).or(config.current_context.take()) else {
        return Ok(None);
    };
    let context = config.contexts.remove(&name).ok_or_else(|| {
        anyhow::anyhow!(
            "no context {name:?} in {} (`forkyard config get-contexts` lists them)",
            path.display()
        )
    })?;
    Ok(Some((name, context)))
}

/// Where the key comes from, once the settings are known; the command is run only
/// when a call needs the key.
#[derive(Debug, Clone, PartialEq)]
pub enum Key {
    None,
    Given(String),
    Command { context: String, command: String },
}

/// The settings a command line gives, by flag or environment variable (clap merges the
/// two): the part of the command line [`Settings::resolve`] reads.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub gateway: Option<String>,
    pub api_key: Option<String>,
    pub gateway_ca: Option<PathBuf>,
    pub output: Option<Output>,
    /// `--jq` was given (its output is JSON).
    pub jq: bool,
}

/// What a command that calls the gateway uses.
#[derive(Debug)]
pub struct Settings {
    pub gateway: String,
    pub gateway_ca: Option<PathBuf>,
    pub key: Key,
    pub output: Output,
}

impl Settings {
    /// Flag, else environment (clap has merged those two into `cli`), else the context,
    /// else the default. The context's key and CA go only to the context's own gateway:
    /// a `--gateway` pointing elsewhere never receives them.
    pub fn resolve(cli: &Flags, context: Option<(String, Context)>) -> Settings {
        let (name, ctx) = context.unwrap_or_default();
        let own_gateway = match (&cli.gateway, &ctx.gateway) {
            (Some(given), Some(its)) => given == its,
            _ => true,
        };
        let gateway = cli
            .gateway
            .clone()
            .or_else(|| ctx.gateway.clone())
            .unwrap_or_else(|| DEFAULT_GATEWAY.to_owned());
        let key = match (&cli.api_key, own_gateway) {
            (Some(k), _) => Key::Given(k.clone()),
            (None, false) => Key::None,
            (None, true) => match (ctx.api_key, ctx.api_key_command) {
                (Some(k), _) => Key::Given(k),
                (None, Some(command)) => Key::Command {
                    context: name,
                    command,
                },
                (None, None) => Key::None,
            },
        };
        let ca = ctx.ca.filter(|_| own_gateway);
        let output = if cli.jq {
            Output::Json
        } else {
            cli.output.or(ctx.output).unwrap_or(Output::Table)
        };
        Settings {
            gateway,
            gateway_ca: cli.gateway_ca.clone().or(ca),
            key,
            output,
        }
    }
}

impl Key {
    /// The key itself: a context's command is run with `sh -c`, its output trimmed.
    /// `interactive`: the command may prompt (a password manager) on this terminal;
    /// completion runs it with no terminal, so a prompt fails instead of hanging.
    pub fn get(&self, interactive: bool) -> anyhow::Result<Option<String>> {
        let (context, command) = match self {
            Key::None => return Ok(None),
            Key::Given(k) => return Ok(Some(k.clone())),
            Key::Command { context, command } => (context, command),
        };
        let io = |on: bool| {
            if on {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            }
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(io(interactive))
            .stderr(io(interactive))
            .output()
            .map_err(|e| anyhow::anyhow!("api-key-command of context {context}: {e}"))?;
        anyhow::ensure!(
            out.status.success(),
            "api-key-command of context {context} failed ({})",
            out.status
        );
        let key = String::from_utf8(out.stdout)
            .map_err(|_| anyhow::anyhow!("api-key-command of context {context}: not UTF-8"))?;
        let key = key.trim();
        anyhow::ensure!(
            !key.is_empty(),
            "api-key-command of context {context} printed nothing"
        );
        Ok(Some(key.to_owned()))
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
