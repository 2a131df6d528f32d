//! `forkyard fork`: launch a run, and with `--wait` follow it to its end.

use crate::output::outln;
use crate::{
    cli::ForkArgs,
    client::{Client, status_error},
    fork_args::{PrMode, PushMode},
    output::{Output, exit_for, print_json, print_run, print_yaml},
    watch,
};
use forkyard_proto::{
    Driver,
    common::v1::AgentSpec,
    gateway::v1::{
        Delivery, LaunchRunRequest, Search,
        delivery::{PullRequests, Push},
    },
};
use std::process::ExitCode;

pub async fn launch(client: &mut Client, a: ForkArgs, output: Output) -> anyhow::Result<ExitCode> {
    let wait = a.wait;
    let launched = client
        .launch_run(launch_request(a))
        .await
        .map_err(status_error)?
        .into_inner();
    if !wait {
        match output {
            Output::Json => print_json(&launched, "forkyard.gateway.v1.LaunchRunResponse")?,
            Output::Yaml => print_yaml(&launched, "forkyard.gateway.v1.LaunchRunResponse")?,
            Output::Table => outln!("{}", launched.run_id),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if launched.created {
        "launched"
    } else {
        "already launched"
    };
    eprintln!("{verb} {}", launched.run_id);
    let run = watch::follow(client, &launched.run_id, output == Output::Table).await?;
    print_run(&run, output)?;
    Ok(exit_for(&run))
}

/// The prompt as `-p` gives it: `@FILE` read from the file, `-` from standard input,
/// `@@…` the text `@…`, anything else itself. Read before the gateway is called, so a
/// missing file costs no launch.
pub fn read_prompt(p: &str) -> anyhow::Result<String> {
    let text = if p == "-" {
        use std::io::{IsTerminal as _, Read as _};
        let mut stdin = std::io::stdin();
        if stdin.is_terminal() {
            eprintln!("reading the prompt from standard input (end it with Ctrl-D)");
        }
        let mut text = String::new();
        stdin
            .read_to_string(&mut text)
            .map_err(|e| anyhow::anyhow!("-p -: standard input: {e}"))?;
        text
    } else if let Some(literal) = p.strip_prefix("@@") {
        format!("@{literal}")
    } else if let Some(file) = p.strip_prefix('@') {
        std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("-p @{file}: {e}"))?
    } else {
        p.to_owned()
    };
    anyhow::ensure!(!text.trim().is_empty(), "-p {p}: the prompt is empty");
    Ok(text)
}

fn launch_request(a: ForkArgs) -> LaunchRunRequest {
    let (backend, backends) = crate::fork_args::backends_of(&a.backend);
    // A local path is sent absolute: the gateway does not share our working directory.
    let repo = match std::fs::canonicalize(&a.repo) {
        Ok(p) if !a.repo.contains("://") => p.to_string_lossy().into_owned(),
        _ => a.repo.clone(),
    };
    LaunchRunRequest {
        request_id: a.request_id,
        repo,
        branch: a.branch,
        prompt: a.prompt,
        forks: a.forks,
        max_concurrent: a.max_concurrent,
        budget_usd: a.budget,
        fork_budget_usd: a.fork_budget.unwrap_or_default(),
        agent: Some(AgentSpec {
            driver: a.driver.unwrap_or_else(|| {
                let default = if a.agent_command.is_some() {
                    Driver::Command
                } else {
                    Driver::ClaudeCode
                };
                default.name().into()
            }),
            command: a.agent_command.unwrap_or_default(),
            model: a.model,
            max_turns: a.max_turns,
            allowed_models: a.allowed_models,
        }),
        egress: a.egress,
        image: a.image,
        isolation: a.isolation,
        backend,
        backends,
        branch_window_secs: a.branch_window,
        search: (a.rounds > 0).then_some(Search {
            rounds: a.rounds,
            keep: a.keep,
            branches: a.branches,
            follow_up: a.follow_up,
        }),
        fork_timeout_secs: a.timeout,
        verify_command: a.verify.unwrap_or_default(),
        stop_on_first_verified: a.stop_on_first_verified,
        labels: a.labels.into_iter().collect(),
        delivery: delivery(a.push, a.pr, a.draft, a.author),
        ..Default::default()
    }
}

fn delivery(
    push: Option<PushMode>,
    pr: Option<PrMode>,
    draft: bool,
    author: Option<(String, String)>,
) -> Option<Delivery> {
    let push = match push? {
        PushMode::Winner => Push::Winner,
        PushMode::Succeeded => Push::Succeeded,
        PushMode::Verified => Push::Verified,
    };
    let pull_requests = match pr {
        None => PullRequests::None,
        Some(PrMode::Winner) => PullRequests::Winner,
        Some(PrMode::Each) => PullRequests::Each,
    };
    let (author_name, author_email) = author.unwrap_or_default();
    Some(Delivery {
        push: push as i32,
        pull_requests: pull_requests as i32,
        draft,
        author_name,
        author_email,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::read_prompt;

    /// `forkyard fork --isolation`: a known level reaches the launch, another is refused
    /// by the CLI naming the choices.
    #[test]
    fn the_isolation_flag_reaches_the_launch_request() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            fork: super::ForkArgs,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["forkyard", "https://example.com/r.git", "-p", "x"];
            argv.extend(extra);
            Cli::try_parse_from(argv).map(|c| super::launch_request(c.fork))
        };
        assert_eq!(
            parse(&["--isolation", "gvisor"]).unwrap().isolation,
            "gvisor"
        );
        assert_eq!(parse(&[]).unwrap().isolation, "");
        let e = parse(&["--isolation", "kata"]).err().unwrap().to_string();
        assert!(e.contains("bubblewrap, gvisor"), "{e}");
    }

    /// `forkyard fork --backend`: local or e2b reach the launch, empty leaves the choice
    /// to the operator's default, another is refused by the CLI naming the choices.
    #[test]
    fn the_backend_flag_reaches_the_launch_request() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            fork: super::ForkArgs,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["forkyard", "https://example.com/r.git", "-p", "x"];
            argv.extend(extra);
            Cli::try_parse_from(argv).map(|c| super::launch_request(c.fork))
        };
        assert_eq!(parse(&["--backend", "e2b"]).unwrap().backend, "e2b");
        assert_eq!(parse(&["--backend", "local"]).unwrap().backend, "local");
        assert_eq!(parse(&[]).unwrap().backend, "");
        let e = parse(&["--backend", "modal"]).err().unwrap().to_string();
        assert!(e.contains("local, e2b"), "{e}");
        // A list: in order, with shares; the last one's may be left out (the rest).
        let req = parse(&["--backend", "local:40,e2b"]).unwrap();
        assert_eq!(req.backend, "");
        let list: Vec<(String, u32)> = req
            .backends
            .into_iter()
            .map(|b| (b.name, b.max_concurrent))
            .collect();
        assert_eq!(list, [("local".into(), 40), ("e2b".into(), 0)]);
        let e = parse(&["--backend", "local:x,e2b"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("a share is a number"), "{e}");
        let e = parse(&["--backend", "local:2,modal"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("\"modal\""), "{e}");
    }

    #[test]
    fn a_prompt_comes_from_a_file_or_is_itself() {
        let dir = tempfile::tempdir().unwrap();
        let task = dir.path().join("task.md");
        std::fs::write(&task, "# Fix it\n\nthe flaky test\n").unwrap();
        let at = format!("@{}", task.display());
        assert_eq!(read_prompt(&at).unwrap(), "# Fix it\n\nthe flaky test\n");
        assert_eq!(read_prompt("fix it").unwrap(), "fix it");
        assert_eq!(read_prompt("@@team fix it").unwrap(), "@team fix it");
        let e = read_prompt("@/nonexistent/task.md")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("-p @/nonexistent/task.md: "), "{e}");
        std::fs::write(&task, "\n  \n").unwrap();
        let e = read_prompt(&at).unwrap_err().to_string();
        assert!(e.ends_with("the prompt is empty"), "{e}");
    }
}
