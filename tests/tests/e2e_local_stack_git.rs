//! Git credentials given to the local stack as a new user gives them: `GITHUB_TOKEN=… make
//! up`, and the README's three commands for any git server (the credentials file written
//! by its `printf`, `FORKYARD_GIT_CREDENTIALS=… make up`, `forkyard fork … --push
//! succeeded --wait`), run from the README's own text against a private repository on
//! a local git server (git http-backend behind lighttpd, basic auth) standing in for
//! git.internal.
//!
//! What the README leaves to its reader, or what cannot be here, is substituted, and
//! only that: git.internal is `127.0.0.1:<port>` (its repository at
//! `/git/app.git`, over http); the token file is one of the test's; `make up` is
//! `scripts/up.sh`, what it runs once it has built; the fork's `…` is a prompt and its
//! agent a command (no model here); `--pr each` is left out (GitLab's API at
//! `https://127.0.0.1/api/v4`, where the README's entry points, is not here;
//! e2e_delivery opens merge requests on a fake GitLab).
//!
//! The stack starts before the file exists, as a pod does before its optional Secret:
//! the file is read when it appears. Runs on the stack's default ports, like
//! e2e_local_stack.

use forkyard_tests::{
    git_server::{GitHttp, Protocol, git_in},
    local_stack::{
        Down, assert_ports_closed, assert_ports_free, environ, pid, root, script, without_keys,
    },
    mesh::bin_dir,
    repo,
    token_scan::{assert_absent, fresh_token, spellings},
};
use std::{
    path::{Path, PathBuf},
    process::Command,
};

const GIT_KEYS: [&str; 2] = ["GITHUB_TOKEN", "FORKYARD_GIT_CREDENTIALS"];
const PROMPT: &str = "add a line to NOTES.md";

/// The README's line that starts with `start` in its "any git server" block.
fn readme_line(start: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let block = readme
        .split("On any git server")
        .nth(1)
        .expect("README: no \"On any git server\" block");
    block
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("README: no line starting {start:?} in the git server block"))
        .to_owned()
}

/// `line` with `from` replaced by `to`, which it must hold.
fn substitute(line: &str, from: &str, to: &str) -> String {
    assert!(
        line.contains(from),
        "README: {line:?} no longer says {from:?}"
    );
    line.replace(from, to)
}

/// `sh -c <line>` in `dir` with `env` (and no keys of the test's own environment); its
/// exit code and output.
fn sh(dir: &Path, line: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", line])
        .current_dir(dir)
        .envs(env.iter().copied());
    let out = without_keys(&mut cmd, env).output().expect("sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Every regular file under `dir`. The stack still runs while it is walked: a directory
/// that goes in the meantime (a sandbox destroyed after its fork) held nothing to scan.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            out.extend(files(&entry.path()));
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    out
}

/// The names of a process's environment.
fn env_names(pid: u32) -> Vec<String> {
    let env = environ(pid);
    env.split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_owned()))
        .collect()
}

/// The README's three commands for any git server, with git.internal and the rest
/// substituted (the module's doc says what): `(printf, make up, fork)`.
fn readme_commands(http: &GitHttp, token_file: &Path) -> [String; 3] {
    let host = format!("127.0.0.1:{}", http.port);
    let printf = readme_line("printf '[[credential]]");
    let printf = substitute(&printf, "git.internal", &host);
    let printf = substitute(&printf, "/secrets/git-token", token_file.to_str().unwrap());
    let up = readme_line("FORKYARD_GIT_CREDENTIALS=");
    let up = substitute(&up, "git.internal", &host);
    let script = root().join("scripts/up.sh").display().to_string();
    let up = substitute(&up, "make up", &script);
    let fork = readme_line("forkyard fork https://git.internal/");
    let fork = substitute(
        &fork,
        "https://git.internal/team/app.git",
        &http.url_of("app"),
    );
    let fork = substitute(&fork, " --pr each", "");
    let fork = substitute(&fork, "\"…\"", &format!("'{PROMPT}'"));
    let fork = format!("{fork} --agent-command 'echo \"$FORKYARD_PROMPT\" >> NOTES.md'");
    [printf, up, fork]
}

#[test]
fn make_up_with_a_github_token_and_the_readmes_credentials_file_clones_and_pushes_privately() {
    assert_ports_free();
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let (git_token, github_token) = (fresh_token(), fresh_token());
    // The README's entry is GitLab's (`oauth2`, the token as password).
    let http = GitHttp::serve_many(&[("app", src.path())], "oauth2", &git_token, Protocol::Any);
    let work = tempfile::tempdir().unwrap();
    let token_file = work.path().join("git-token");
    std::fs::write(&token_file, format!("{git_token}\n")).unwrap();
    let [printf, up, fork] = readme_commands(&http, &token_file);
    let state = tempfile::tempdir().unwrap();
    let _down = Down(state.path());
    let bins = bin_dir();

    // `GITHUB_TOKEN=… make up` and the README's `FORKYARD_GIT_CREDENTIALS=… make up`,
    // before the file is there (as a pod starts before its optional Secret exists).
    let env = [
        ("FORKYARD_STATE_DIR", state.path().to_str().unwrap()),
        ("FORKYARD_BIN_DIR", bins.to_str().unwrap()),
        ("GITHUB_TOKEN", github_token.as_str()),
    ];
    let (code, printed) = sh(work.path(), &up, &env);
    assert_eq!(code, Some(0), "{up}: {printed}");
    only_the_gateway_and_provisioner_hold_them(state.path(), &github_token, work.path());
    let path = format!("{}:{}", bins.display(), std::env::var("PATH").unwrap());
    let no_config = work.path().join("no-config.toml");
    let cli = [
        ("PATH", path.as_str()),
        ("FORKYARD_CONFIG", no_config.to_str().unwrap()),
    ];
    refused_until_the_file_is_there(state.path(), &sh(work.path(), &fork, &cli));

    // The README's printf; the same fork again, with no restart: every succeeded fork's
    // branch pushed.
    assert_eq!(sh(work.path(), &printf, &[]).0, Some(0), "{printf}");
    let (code, out) = sh(work.path(), &fork, &cli);
    assert_eq!(code, Some(0), "{fork}: {out}");
    let run = out
        .lines()
        .find_map(|l| l.strip_prefix("launched "))
        .unwrap_or_else(|| panic!("no run id: {out}"))
        .trim()
        .to_owned();
    branches_on_the_server(&http, &run);

    let secrets = [
        spellings("oauth2", &git_token),
        spellings("x-access-token", &github_token),
    ]
    .concat();
    assert_absent("what make up printed", &printed, &secrets);
    assert_absent("what the CLI printed", &out, &secrets);
    in_no_file_of_the_stack(state.path(), &secrets);
    let down = script("down.sh", state.path(), &[]);
    assert!(down.contains("stopped gateway"), "{down}");
    assert_ports_closed();
}

/// Before the file is there the private repository is refused at launch, naming its
/// host, the tenant and the setting, and the gateway says once that the file is missing.
fn refused_until_the_file_is_there(state: &Path, (code, out): &(Option<i32>, String)) {
    assert_ne!(*code, Some(0), "{out}");
    let says = [
        "127.0.0.1",
        "tenant default has none",
        "FORKYARD_GIT_CREDENTIALS",
    ];
    assert!(says.iter().all(|s| out.contains(s)), "{out}");
    assert!(!out.contains("launched "), "{out}");
    let log = std::fs::read_to_string(state.join("logs/gateway.log")).unwrap();
    let said = log.matches("git credentials file not found").count();
    assert_eq!(said, 1, "{log}");
}

/// The gateway and the provisioner have the token and the file's name in their
/// environment; the other services and Temporal have neither.
fn only_the_gateway_and_provisioner_hold_them(state: &Path, github_token: &str, work: &Path) {
    let file = work.join("git-credentials.toml");
    for s in ["gateway", "sandbox-provisioner"] {
        let env = environ(pid(state, s));
        assert!(
            env.contains(&format!("\0GITHUB_TOKEN={github_token}\0")),
            "{s}"
        );
        let named = format!("\0FORKYARD_GIT_CREDENTIALS={}\0", file.display());
        assert!(env.contains(&named), "{s}: no {named:?}");
    }
    for s in ["agent-runner", "budget-ledger", "janitor", "temporal"] {
        let names = env_names(pid(state, s));
        assert!(
            names.iter().any(|n| n == "FORKYARD_STATE_DIR"),
            "{s}: {names:?}"
        );
        for key in GIT_KEYS {
            assert!(!names.iter().any(|n| n == key), "{s} was given {key}");
        }
        assert!(!environ(pid(state, s)).contains(github_token), "{s}");
    }
}

/// Each of the run's three forks is a branch `forkyard-fork-<n>` (the default) of the
/// private repository: a commit of this run's holding what its agent wrote.
fn branches_on_the_server(http: &GitHttp, run: &str) {
    let repo = http.repo_of("app");
    let names = git_in(
        &repo,
        &["for-each-ref", "--format=%(refname:short)", "refs/heads/"],
    );
    for n in 1..=3 {
        let branch = format!("forkyard-fork-{n}");
        assert!(names.lines().any(|l| l == branch), "no {branch} in {names}");
        let notes = git_in(&repo, &["show", &format!("{branch}:NOTES.md")]);
        assert!(notes.contains(PROMPT), "{branch}: {notes}");
        let message = git_in(&repo, &["log", "-1", "--format=%B", &branch]);
        assert!(message.contains(run), "{branch}: {message}");
    }
}

/// No file the stack keeps (its logs, pid and settings files, Temporal's and the
/// ledger's databases, its workspaces) holds a secret, in any spelling.
fn in_no_file_of_the_stack(state: &Path, secrets: &[String]) {
    let all = files(state);
    for want in [
        "temporal.db",
        "ledger.db",
        "logs/gateway.log",
        "logs/sandbox-provisioner.log",
    ] {
        assert!(
            all.iter().any(|p| p.ends_with(want)),
            "no {want} in {all:?}"
        );
    }
    for path in &all {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
        assert_absent(&path.display().to_string(), &text, secrets);
    }
}
