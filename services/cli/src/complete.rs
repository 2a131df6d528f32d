//! Completion as the shell asks for it: clap_complete's dynamic engine. The script
//! `forkyard completion <shell>` prints (the same as `COMPLETE=<shell> forkyard`) calls
//! `forkyard` back at each TAB; a run id is completed from the gateway's ListRuns, a
//! context name from the config file.

use crate::config::{self, Flags, Settings};
use clap_complete::engine::CompletionCandidate;
use forkyard_proto::gateway::v1::ListRunsRequest;
use std::{ffi::OsStr, time::Duration};

/// How long a TAB may wait for the gateway before it completes nothing.
const ASK_FOR: Duration = Duration::from_secs(3);

/// The run ids that start with `current`, newest first, each with its state and age
/// (zsh and fish show them). Nothing when the gateway cannot say.
pub fn run_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let Some(prefix) = current.to_str() else {
        return Vec::new();
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    let runs = runtime.block_on(async {
        tokio::time::timeout(ASK_FOR, list(&completing_words()))
            .await
            .ok()
            .and_then(Result::ok)
    });
    runs.unwrap_or_default()
        .into_iter()
        .filter(|r| r.run_id.starts_with(prefix))
        .map(|r| {
            let when = crate::when::age(crate::when::now_ms() - r.started_unix_ms);
            let help = format!("{}, started {when}", crate::table::run_state(r.state));
            CompletionCandidate::new(r.run_id).help(Some(help.into()))
        })
        .collect()
}

/// The config file's context names that start with `current`.
pub fn context_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let prefix = current.to_string_lossy();
    let Some(config) = config::path().and_then(|p| config::load(&p).ok()) else {
        return Vec::new();
    };
    config
        .contexts
        .into_keys()
        .filter(|n| n.starts_with(prefix.as_ref()))
        .map(CompletionCandidate::new)
        .collect()
}

/// The words of the command line being completed: the shell passes them after `--`.
fn completing_words() -> Vec<String> {
    std::env::args().skip_while(|a| a != "--").skip(1).collect()
}

/// `--name VALUE` or `--name=VALUE` as typed so far.
fn typed(words: &[String], name: &str) -> Option<String> {
    let long = format!("--{name}");
    let with_eq = format!("--{name}=");
    words.iter().enumerate().find_map(|(i, w)| {
        if let Some(v) = w.strip_prefix(&with_eq) {
            Some(v.to_owned())
        } else if *w == long {
            words.get(i + 1).cloned()
        } else {
            None
        }
    })
}

/// The settings this command line would use (its flags as typed so far, then the
/// environment, the context, the defaults), and the gateway's newest runs.
async fn list(words: &[String]) -> anyhow::Result<Vec<forkyard_proto::gateway::v1::RunSummary>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let given = |flag: &str, var: &str| typed(words, flag).or_else(|| env(var));
    let flags = Flags {
        gateway: given("gateway", "FORKYARD_GATEWAY"),
        api_key: given("api-key", "FORKYARD_API_KEY"),
        gateway_ca: typed(words, "ca")
            .or_else(|| given("gateway-ca", "FORKYARD_GATEWAY_CA"))
            .map(Into::into),
        ..Flags::default()
    };
    let context = given("context", "FORKYARD_CONTEXT");
    let settings = Settings::resolve(&flags, config::selected(context.as_deref())?);
    let key = settings.key.get(false)?;
    let mut client = crate::client::connect(
        &settings.gateway,
        key.as_deref(),
        settings.gateway_ca.as_deref(),
    )
    .await?;
    let runs = client
        .list_runs(ListRunsRequest {
            page_size: 200,
            ..Default::default()
        })
        .await?
        .into_inner()
        .runs;
    Ok(runs)
}

/// The script that registers forkyard's completion in `shell`: it calls this binary
/// back (by the name it was run as, made absolute when it is a relative path, as
/// `COMPLETE=<shell> forkyard` would).
pub fn registration(shell: clap_complete::Shell) -> anyhow::Result<String> {
    let shells = clap_complete::env::Shells::builtins();
    let name = shell.to_string();
    let completer = shells
        .completer(&name)
        .ok_or_else(|| anyhow::anyhow!("no dynamic completion for {name}"))?;
    let argv0 = std::path::PathBuf::from(std::env::args_os().next().unwrap_or_default());
    let bin = if argv0.components().count() > 1 {
        std::env::current_dir()?.join(argv0)
    } else {
        argv0
    };
    let mut script = Vec::new();
    completer.write_registration(
        "COMPLETE",
        "forkyard",
        "forkyard",
        &bin.to_string_lossy(),
        &mut script,
    )?;
    Ok(String::from_utf8(script)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn typed_flags_are_read_in_both_spellings() {
        let words: Vec<String> = [
            "forkyard",
            "--gateway",
            "http://a:1",
            "--context=prod",
            "status",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            super::typed(&words, "gateway").as_deref(),
            Some("http://a:1")
        );
        assert_eq!(super::typed(&words, "context").as_deref(), Some("prod"));
        assert_eq!(super::typed(&words, "api-key"), None);
    }
}
