//! `forkyard config`: the contexts file's commands, as kubectl's `config`. None of them
//! calls the gateway or runs a context's key command, and a broken current context
//! does not stop them (`use-context` is how it is mended).

use crate::{
    cli::{ConfigCommand, SetContextArgs},
    config::{self, Config, Context},
    output::Output,
    output::{outln, print_value},
};
use std::{path::PathBuf, process::ExitCode};

/// The global settings as typed on this command line: `set-context` stores these, never
/// what came from the environment.
#[derive(Debug, Default)]
pub struct Typed {
    pub gateway: Option<String>,
    pub api_key: Option<String>,
    pub gateway_ca: Option<PathBuf>,
}

pub fn run(command: ConfigCommand, typed: Typed, output: Output) -> anyhow::Result<ExitCode> {
    let path = config::path()
        .ok_or_else(|| anyhow::anyhow!("no config file: set HOME or FORKYARD_CONFIG"))?;
    let mut config = config::load(&path)?;
    match command {
        ConfigCommand::GetContexts => get_contexts(&config, output)?,
        ConfigCommand::CurrentContext => match &config.current_context {
            Some(name) => outln!("{name}"),
            None => anyhow::bail!("no current context (`forkyard config use-context NAME`)"),
        },
        ConfigCommand::UseContext { name } => {
            exists(&config, &name, &path)?;
            config.current_context = Some(name.clone());
            config::save(&path, &config)?;
            eprintln!("switched to context {name}");
        }
        ConfigCommand::DeleteContext { name } => {
            exists(&config, &name, &path)?;
            config.contexts.remove(&name);
            if config.current_context.as_ref() == Some(&name) {
                config.current_context = None;
            }
            config::save(&path, &config)?;
            eprintln!("deleted context {name} from {}", path.display());
        }
        ConfigCommand::SetContext(args) => set_context(&mut config, args, typed, &path)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn exists(config: &Config, name: &str, path: &std::path::Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.contexts.contains_key(name),
        "no context {name:?} in {} (`forkyard config get-contexts` lists them)",
        path.display()
    );
    Ok(())
}

fn set_context(
    config: &mut Config,
    args: SetContextArgs,
    typed: Typed,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let name = args.name;
    anyhow::ensure!(
        !name.trim().is_empty() && !name.chars().any(char::is_control),
        "{name:?} is not a context name"
    );
    let created = !config.contexts.contains_key(&name);
    let ctx = config.contexts.entry(name.clone()).or_default();
    if let Some(g) = typed.gateway {
        anyhow::ensure!(
            g.starts_with("http://") || g.starts_with("https://"),
            "--gateway {g:?}: not an http:// or https:// address"
        );
        ctx.gateway = Some(g);
    }
    if let Some(ca) = typed.gateway_ca {
        // Kept absolute: the file is read from any directory.
        let abs = std::fs::canonicalize(&ca)
            .map_err(|e| anyhow::anyhow!("--ca {}: {e}", ca.display()))?;
        ctx.ca = Some(abs);
    }
    if let Some(k) = typed.api_key {
        ctx.api_key = Some(k);
        ctx.api_key_command = None;
    }
    if let Some(c) = args.api_key_command {
        ctx.api_key_command = Some(c);
        ctx.api_key = None;
    }
    if let Some(o) = args.default_output {
        ctx.output = Some(o);
    }
    if args.current {
        config.current_context = Some(name.clone());
    }
    config::save(path, config)?;
    let verb = if created { "created" } else { "modified" };
    eprintln!("context {name} {verb} in {}", path.display());
    Ok(())
}

/// One context as `get-contexts` shows it: whether a key is set, never the key.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Row<'a> {
    name: &'a str,
    current: bool,
    gateway: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<String>,
    /// "stored" (in the file), "command" or "none".
    api_key: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key_command: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<Output>,
}

fn row<'a>(name: &'a str, c: &'a Context, current: bool) -> Row<'a> {
    let api_key = match (&c.api_key, &c.api_key_command) {
        (Some(_), _) => "stored",
        (None, Some(_)) => "command",
        (None, None) => "none",
    };
    Row {
        name,
        current,
        gateway: c.gateway.as_deref().unwrap_or(config::DEFAULT_GATEWAY),
        ca: c.ca.as_ref().map(|p| p.display().to_string()),
        api_key,
        api_key_command: c.api_key_command.as_deref(),
        output: c.output,
    }
}

fn get_contexts(config: &Config, output: Output) -> anyhow::Result<()> {
    let current = config.current_context.as_deref();
    let rows: Vec<Row<'_>> = config
        .contexts
        .iter()
        .map(|(n, c)| row(n, c, Some(n.as_str()) == current))
        .collect();
    if output != Output::Table {
        return print_value(&rows, output);
    }
    let width = |f: &dyn Fn(&Row<'_>) -> usize, title: usize| {
        rows.iter().map(f).max().unwrap_or(0).max(title)
    };
    let (wn, wg) = (width(&|r| r.name.len(), 4), width(&|r| r.gateway.len(), 7));
    let wc = width(&|r| r.ca.as_ref().map_or(1, String::len), 2);
    outln!(
        "CURRENT  {:<wn$}  {:<wg$}  {:<wc$}  API-KEY  OUTPUT",
        "NAME",
        "GATEWAY",
        "CA"
    );
    for r in &rows {
        let output = r.output.map_or("-", |o| match o {
            Output::Table => "table",
            Output::Json => "json",
            Output::Yaml => "yaml",
        });
        outln!(
            "{:<7}  {:<wn$}  {:<wg$}  {:<wc$}  {:<7}  {output}",
            if r.current { "*" } else { "" },
            r.name,
            r.gateway,
            r.ca.as_deref().unwrap_or("-"),
            r.api_key,
        );
    }
    Ok(())
}
