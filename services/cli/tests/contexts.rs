//! Contexts in ~/.config/forkyard/config.toml, as kubectl's: set, used, listed (the key
//! never shown), and each setting taken from its flag, else its environment variable,
//! else the context, else the default.

mod common;

use common::{Fake, forkyard, ok, stderr};
use forkyard_proto::gateway::v1::{Run, RunState};

/// A gateway with one run, and the bearer tokens it was sent.
async fn gateway() -> (Fake, String) {
    let fake = Fake::default();
    fake.0.lock().unwrap().runs = vec![Run {
        run_id: "run-1".into(),
        state: RunState::Completed as i32,
        ..Default::default()
    }];
    let endpoint = fake.serve().await;
    (fake, endpoint)
}

fn last_bearer(fake: &Fake) -> String {
    fake.0
        .lock()
        .unwrap()
        .bearers
        .last()
        .cloned()
        .unwrap_or_default()
}

/// Nothing listens there.
const DEAD: &str = "http://127.0.0.1:9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_names_the_gateway_its_key_command_and_output() {
    let (fake, gw) = gateway().await;
    let home = tempfile::tempdir().unwrap();
    let xdg = home.path().join("xdg");
    let env = [
        ("FORKYARD_CONFIG", ""),
        ("XDG_CONFIG_HOME", xdg.to_str().unwrap()),
    ];
    let set = |args: &[&str]| {
        let mut all = vec!["config", "set-context"];
        all.extend_from_slice(args);
        forkyard(&all, &env, None)
    };
    ok(
        &set(&[
            "prod",
            "--gateway",
            &gw,
            "--api-key-command",
            "echo fyk_prod",
            "--default-output",
            "yaml",
        ]),
        0,
    );
    ok(
        &set(&["dead", "--gateway", DEAD, "--api-key", "fyk_secret_dead"]),
        0,
    );
    let file = xdg.join("forkyard/config.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("[contexts.prod]") && !text.contains("current-context"),
        "{text}"
    );

    // No current context yet: the default gateway (nothing there).
    let out = forkyard(
        &["status", "run-1"],
        &[env[0], env[1], ("FORKYARD_GATEWAY", DEAD)],
        None,
    );
    ok(&out, 1);

    ok(&forkyard(&["config", "use-context", "prod"], &env, None), 0);
    let out = forkyard(&["status", "run-1"], &env, None);
    // The context's output (yaml), and its key command's key on the call.
    assert!(
        ok(&out, 0).starts_with("runId: run-1\n"),
        "{}",
        stderr(&out)
    );
    assert_eq!(last_bearer(&fake), "Bearer fyk_prod");

    let out = forkyard(&["config", "get-contexts"], &env, None);
    let table = ok(&out, 0);
    assert!(!table.contains("fyk_"), "a key is never shown: {table}");
    let prod = table.lines().find(|l| l.contains("prod")).unwrap();
    assert!(
        prod.starts_with('*') && prod.contains("command") && prod.contains("yaml"),
        "{table}"
    );
    let dead = table.lines().find(|l| l.contains("dead")).unwrap();
    assert!(dead.contains("stored"), "{table}");
    let out = forkyard(
        &[
            "config",
            "get-contexts",
            "--jq",
            ".[] | select(.current) | .name",
        ],
        &env,
        None,
    );
    assert_eq!(ok(&out, 0), "prod\n");
    assert_eq!(
        ok(&forkyard(&["config", "current-context"], &env, None), 0),
        "prod\n"
    );

    // --context picks another for one command; a context that does not exist is named.
    let out = forkyard(&["--context", "dead", "status", "run-1"], &env, None);
    assert!(
        stderr(&out).contains("cannot reach the gateway at http://127.0.0.1:9"),
        "{}",
        stderr(&out)
    );
    let out = forkyard(&["--context", "nope", "status", "run-1"], &env, None);
    ok(&out, 1);
    assert!(
        stderr(&out).contains("no context \"nope\" in"),
        "{}",
        stderr(&out)
    );
    ok(&forkyard(&["config", "use-context", "nope"], &env, None), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_beat_the_environment_which_beats_the_context() {
    let (fake, gw) = gateway().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fy.toml");
    let cfg = config.to_str().unwrap();
    let env = [("FORKYARD_CONFIG", cfg)];
    ok(
        &forkyard(
            &[
                "config",
                "set-context",
                "dead",
                "--gateway",
                DEAD,
                "--api-key",
                "fyk_dead",
                "--current",
            ],
            &env,
            None,
        ),
        0,
    );
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("current-context = \"dead\"")
    );

    // The environment's gateway wins over the context's; the context's key stays
    // with its own gateway.
    let out = forkyard(
        &["status", "run-1"],
        &[env[0], ("FORKYARD_GATEWAY", &gw)],
        None,
    );
    ok(&out, 0);
    assert_eq!(
        last_bearer(&fake),
        "",
        "the context's key went to another gateway"
    );
    // The flag wins over the environment.
    let out = forkyard(
        &["--gateway", &gw, "status", "run-1"],
        &[env[0], ("FORKYARD_GATEWAY", DEAD)],
        None,
    );
    ok(&out, 0);
    // A key from the environment goes wherever the gateway is; a flag's wins.
    let out = forkyard(
        &["status", "run-1", "--gateway", &gw],
        &[env[0], ("FORKYARD_API_KEY", "fyk_env")],
        None,
    );
    ok(&out, 0);
    assert_eq!(last_bearer(&fake), "Bearer fyk_env");
    let out = forkyard(
        &["status", "run-1", "--gateway", &gw, "--api-key", "fyk_flag"],
        &[env[0], ("FORKYARD_API_KEY", "fyk_env")],
        None,
    );
    ok(&out, 0);
    assert_eq!(last_bearer(&fake), "Bearer fyk_flag");
    // -o beats FORKYARD_OUTPUT.
    let out = forkyard(
        &["status", "run-1", "--gateway", &gw, "-o", "json"],
        &[env[0], ("FORKYARD_OUTPUT", "yaml")],
        None,
    );
    assert!(ok(&out, 0).starts_with('{'));

    // set-context stores what was typed, never what the environment said.
    let out = forkyard(
        &["config", "set-context", "envless"],
        &[
            env[0],
            ("FORKYARD_GATEWAY", &gw),
            ("FORKYARD_API_KEY", "fyk_env"),
        ],
        None,
    );
    ok(&out, 0);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(!text.contains("fyk_env") && !text.contains(&gw), "{text}");
    // A failing key command stops the command, saying which context.
    ok(
        &forkyard(
            &[
                "config",
                "set-context",
                "dead",
                "--api-key-command",
                "exit 7",
            ],
            &env,
            None,
        ),
        0,
    );
    let out = forkyard(&["status", "run-1"], &env, None);
    ok(&out, 1);
    assert!(
        stderr(&out).contains("api-key-command of context dead failed"),
        "{}",
        stderr(&out)
    );
    ok(
        &forkyard(&["config", "delete-context", "dead"], &env, None),
        0,
    );
    ok(&forkyard(&["config", "current-context"], &env, None), 1);
}

#[test]
fn a_broken_file_is_named_and_config_commands_still_mend_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fy.toml");
    std::fs::write(&config, "current-context = \"gone\"\n").unwrap();
    let env = [("FORKYARD_CONFIG", config.to_str().unwrap())];
    let out = forkyard(&["status", "run-1"], &env, None);
    ok(&out, 1);
    assert!(
        stderr(&out).contains("no context \"gone\""),
        "{}",
        stderr(&out)
    );
    ok(
        &forkyard(
            &[
                "config",
                "set-context",
                "local",
                "--gateway",
                DEAD,
                "--current",
            ],
            &env,
            None,
        ),
        0,
    );
    let out = forkyard(
        &["config", "set-context", "x", "--gateway", "ftp://x"],
        &env,
        None,
    );
    ok(&out, 1);
    assert!(
        stderr(&out).contains("not an http:// or https:// address"),
        "{}",
        stderr(&out)
    );
    let out = forkyard(
        &["config", "set-context", "x", "--ca", "/nonexistent.pem"],
        &env,
        None,
    );
    ok(&out, 1);
    assert!(
        stderr(&out).contains("--ca /nonexistent.pem"),
        "{}",
        stderr(&out)
    );
    std::fs::write(&config, "[contexts.a]\ngatway = \"x\"\n").unwrap();
    let out = forkyard(&["config", "get-contexts"], &env, None);
    ok(&out, 1);
    assert!(
        stderr(&out).contains(config.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
}
