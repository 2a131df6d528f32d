//! Bubblewrap's command line: its isolation flags, the command last, and the
//! environment read from a descriptor, never from the argv.

use super::*;
use crate::local::isolation::network::forwarder_kit;

/// A command in sandbox `sbx-1` with nothing of its own: no relays, image or tools.
fn plain<'a>(argv: &'a [String], env: &'a [(String, String)]) -> Invocation<'a> {
    Invocation {
        bwrap: Path::new("bwrap"),
        features: Features { userns: true },
        workspace: Path::new("/state/ws"),
        overlay: None,
        sandbox_id: "sbx-1",
        relays: None,
        cgroup_joins: &[],
        argv,
        env,
        seccomp: &[],
        tools: None,
        toolchains: &[],
        uid: None,
        image: None,
        init: false,
        file_size: None,
    }
}

fn inv_args(egress: bool) -> (Vec<String>, Vec<(String, String)>) {
    let kit_dir = tempfile::tempdir().unwrap();
    let kit =
        forwarder_kit::ForwarderKit::prepare(Path::new("/bin/true"), &kit_dir.path().join("fwd"))
            .unwrap();
    let argv = ["ls".to_owned()];
    let env = [("A".to_owned(), "secret-value".to_owned())];
    let inv = Invocation {
        relays: egress.then_some(Relays {
            forwarder: &kit,
            egress: Some(Path::new("/state/egress.sock")),
            llm: None,
        }),
        ..plain(&argv, &env)
    };
    let args = inv
        .args()
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect();
    (args, inv.env())
}

#[test]
fn isolation_flags_and_command_last_and_no_env_on_argv() {
    let (a, env) = inv_args(false);
    let a = a.join(" ");
    assert!(a.starts_with("--unshare-all"), "{a}");
    assert!(!a.contains("--share-net"), "{a}");
    assert!(a.contains("--bind /state/ws /workspace"), "{a}");
    assert!(!a.contains("secret-value") && !a.contains("sbx-1"), "{a}");
    assert!(env.contains(&("A".into(), "secret-value".into())));
    assert!(env.contains(&("FORKYARD_SANDBOX_ID".into(), "sbx-1".into())));
    assert!(!a.contains("--ro-bind /etc /etc"), "{a}");
    assert!(!a.contains("resolv.conf"), "{a}");
    assert!(a.ends_with("-- ls"), "{a}");
    let (a, env) = inv_args(true);
    let a = a.join(" ");
    assert!(
        !a.contains("--share-net"),
        "egress keeps its own netns: {a}"
    );
    assert!(
        a.ends_with(
            "-- /run/forkyard/fwd/ld.so --library-path /run/forkyard/fwd --preload /run/forkyard/fwd/libc.so.6 /run/forkyard/fwd/true 127.0.0.1:3128=/run/forkyard/egress.sock -- ls"
        ),
        "{a}"
    );
    assert!(
        env.iter()
            .any(|(k, v)| k == "HTTPS_PROXY" && v == "http://127.0.0.1:3128")
    );
}

#[test]
fn host_processes_start_with_no_environment_and_bwrap_reads_it_from_the_fd() {
    let argv = ["ls".to_owned()];
    let env = [("LD_PRELOAD".to_owned(), "/workspace/x.so".to_owned())];
    // Opened at spawn set-up, so it must exist; any writable file stands in.
    let cgroup = tempfile::NamedTempFile::new().unwrap();
    let procs = [cgroup.path().to_path_buf()];
    let inv = Invocation {
        bwrap: Path::new("/usr/bin/bwrap"),
        features: Features { userns: true },
        workspace: Path::new("/state/ws"),
        overlay: None,
        sandbox_id: "sbx-1",
        relays: None,
        cgroup_joins: &procs,
        argv: &argv,
        env: &env,
        seccomp: &[],
        tools: None,
        toolchains: &[],
        uid: Some(1_000_000_007),
        image: None,
        init: false,
        file_size: None,
    };
    let cmd = inv.command().unwrap();
    assert_eq!(
        cmd.as_std().get_envs().count(),
        0,
        "the wrapper shell and bwrap get no variable"
    );
    let args: Vec<String> = cmd
        .as_std()
        .get_args()
        .map(|a| a.to_str().unwrap().to_owned())
        .collect();
    assert!(args.join(" ").contains("--args 3 --"), "{args:?}");
    // bwrap itself, no wrapper: the cgroup join and the uid drop happen in its
    // process before exec (`crate::local::isolation::bubblewrap::enter`).
    assert_eq!(cmd.as_std().get_program(), "/usr/bin/bwrap");
    assert_eq!(args[0], "--unshare-all", "{args:?}");
    assert!(!args.iter().any(|a| a.contains("x.so")), "{args:?}");
    let data = String::from_utf8(inv.env_args()).unwrap();
    let parts: Vec<&str> = data.split_terminator('\0').collect();
    assert_eq!(parts[0], "--clearenv");
    assert!(
        parts
            .windows(3)
            .any(|w| w == ["--setenv", "LD_PRELOAD", "/workspace/x.so"]),
        "{parts:?}"
    );
}

/// The operator's agent CLIs and toolchains: bound read-only at TOOLS and
/// TOOLCHAINS/<name>, their `bin`s (agents first) first on the host's PATH and last on an
/// image's.
#[test]
fn agent_tools_and_toolchains_are_bound_read_only_and_on_path() {
    let argv = ["claude".to_owned()];
    let image_env = [("PATH".to_owned(), "/opt/image/bin:/usr/bin".to_owned())];
    let rootfs = Path::new("/state/images/x/rootfs");
    let toolchains = [crate::local::isolation::host_tools::Toolchain {
        name: "rust".into(),
        dir: "/home/u/.rustup/toolchains/stable".into(),
    }];
    for on_image in [false, true] {
        let inv = Invocation {
            tools: Some(Path::new("/home/u/.cache/forkyard/agents")),
            toolchains: &toolchains,
            image: on_image.then_some(ImageRoot {
                rootfs,
                env: &image_env,
            }),
            ..plain(&argv, &[])
        };
        let args: Vec<String> = inv
            .args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let args = args.join(" ");
        assert!(
            args.contains("--ro-bind /home/u/.cache/forkyard/agents /run/forkyard/tools"),
            "{args}"
        );
        let env = inv.env();
        let path = &env.iter().rev().find(|(k, _)| k == "PATH").unwrap().1;
        assert!(
            args.contains(
                "--ro-bind /home/u/.rustup/toolchains/stable /run/forkyard/toolchains/rust"
            ),
            "{args}"
        );
        let want = if on_image {
            "/opt/image/bin:/usr/bin:/run/forkyard/tools/bin:/run/forkyard/toolchains/rust/bin"
        } else {
            "/run/forkyard/tools/bin:/run/forkyard/toolchains/rust/bin:/usr/local/bin:/usr/bin:/bin"
        };
        assert_eq!(path, want);
    }
}
