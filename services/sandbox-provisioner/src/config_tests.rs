//! The flags' defaults, and errors that name the setting at fault.

use super::*;
use clap::Parser;

/// The flags of a start on `state`, with `extra`.
fn args_on(state: &str, extra: &[&str]) -> Args {
    let argv = ["sandbox-provisioner", "--state-dir", state];
    Args::try_parse_from(argv.iter().chain(extra)).unwrap()
}

#[test]
fn defaults_and_errors_name_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().to_str().unwrap();
    let args = args_on(state, &[]);
    let (listen, config, _) = args.resolve().unwrap();
    assert_eq!(listen.to_string(), "127.0.0.1:50052");
    assert_eq!(config.advertise_endpoint, "http://127.0.0.1:50052");
    assert_eq!(config.exec_timeout, Duration::from_secs(600));
    assert_eq!(
        config.owner_task_queue,
        format!("sandbox-provisioner/{}-50052", hostname())
    );
    let args = args_on(state, &["--replica-id", "host-b"]);
    assert_eq!(
        args.resolve().unwrap().1.owner_task_queue,
        "sandbox-provisioner/host-b"
    );
    for bad in ["", "a/b", "x y"] {
        let args = args_on(state, &["--replica-id", bad]);
        assert!(
            args.resolve().unwrap_err().contains("--replica-id"),
            "{bad:?}"
        );
    }

    let args = args_on(state, &["--listen", "nope"]);
    assert!(args.resolve().unwrap_err().contains("--listen"));
    let args = args_on(state, &["--exec-timeout-secs", "0"]);
    assert!(
        args.resolve()
            .unwrap_err()
            .contains("FORKYARD_EXEC_TIMEOUT_SECS")
    );
}

#[test]
fn the_hosts_a_create_may_reach_are_checked_naming_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().to_str().unwrap();
    for (flag, env) in [
        ("--allowed-registries", "FORKYARD_ALLOWED_REGISTRIES"),
        ("--allowed-git-hosts", "FORKYARD_ALLOWED_GIT_HOSTS"),
    ] {
        let args = |v: &str| {
            Args::try_parse_from(["sandbox-provisioner", "--state-dir", state, flag, v]).unwrap()
        };
        assert!(
            args("ghcr.io,*.corp.example:5000,10.0.0.7")
                .resolve()
                .is_ok()
        );
        for bad in ["*", "host:0", "a b"] {
            let e = args(bad).resolve().unwrap_err();
            assert!(e.contains(env), "{flag} {bad:?}: {e}");
        }
    }
}
