//! The bundle a gVisor sandbox starts from: what bubblewrap's command line says for the
//! same sandbox, and mount points made without following a link.

use super::*;
use crate::local::isolation::{
    bubblewrap::bwrap::{Features, ImageRoot, Relays},
    gvisor::layout::make_mount_point,
    network::forwarder_kit::ForwarderKit,
};

/// The init of sandbox `sbx-1` with an egress relay, as `Provisioner::start_init` makes it.
fn with_init<R>(image: Option<&Path>, f: impl FnOnce(&Invocation<'_>, &ForwarderKit) -> R) -> R {
    let kit_dir = tempfile::tempdir().unwrap();
    let kit = ForwarderKit::prepare(Path::new("/bin/true"), &kit_dir.path().join("fwd")).unwrap();
    let argv = kit.argv();
    let image_env = [("IMAGE_VAR".to_owned(), "1".to_owned())];
    let inv = Invocation {
        bwrap: Path::new("bwrap"),
        features: Features { userns: true },
        workspace: Path::new("/state/sbx-1/workspace"),
        overlay: None,
        sandbox_id: "sbx-1",
        relays: Some(Relays {
            forwarder: &kit,
            egress: Some(Path::new("/state/sbx-1/egress.sock")),
            llm: Some(Path::new("/state/sbx-1/llm.sock")),
        }),
        cgroup_joins: &[],
        argv: &argv,
        env: &[],
        seccomp: &[],
        tools: None,
        toolchains: &[],
        uid: Some(1_000_000_001),
        image: image.map(|rootfs| ImageRoot {
            rootfs,
            env: &image_env,
        }),
        init: true,
        file_size: Some(1 << 30),
    };
    f(&inv, &kit)
}

fn container(image: Option<&Path>) -> (Container, String) {
    with_init(image, |inv, kit| {
        let c = Container::of(inv, Path::new("/g/root"), Path::new("/g/run"), (1024, 4096));
        (c, kit.dir.display().to_string())
    })
}

fn bind<'a>(c: &'a Container, dest: &str) -> Option<&'a Bind> {
    c.binds.iter().find(|b| b.dest == dest)
}

#[test]
fn the_host_tools_sandbox_sees_usr_read_only_its_relays_and_its_workspace() {
    let (c, kit) = container(None);
    assert_eq!(c.root, Path::new("/g/root"));
    assert_eq!(bind(&c, "/usr"), Some(&Bind::ro("/usr", "/usr").on_host()));
    assert_eq!(bind(&c, RUN), Some(&Bind::ro("/g/run", RUN)));
    assert_eq!(
        bind(&c, forwarder_kit::IN_SANDBOX),
        Some(&Bind::ro(kit, forwarder_kit::IN_SANDBOX).on_host())
    );
    assert_eq!(
        bind(&c, bwrap::PROXY_SOCKET_IN_SANDBOX),
        Some(&Bind::rw("/state/sbx-1/egress.sock", bwrap::PROXY_SOCKET_IN_SANDBOX).on_host())
    );
    assert_eq!(
        bind(&c, "/workspace"),
        Some(&Bind::rw("/state/sbx-1/workspace", "/workspace"))
    );
    // Nothing else of the host is writable, and no secret of /etc is there.
    let writable: Vec<_> = c
        .binds
        .iter()
        .filter(|b| b.writable)
        .map(|b| b.dest.as_str())
        .collect();
    assert_eq!(
        writable,
        [
            bwrap::PROXY_SOCKET_IN_SANDBOX,
            bwrap::LLM_SOCKET_IN_SANDBOX,
            "/workspace"
        ]
    );
    assert!(
        c.binds
            .iter()
            .all(|b| !b.dest.contains("shadow") && b.dest != "/etc"),
        "{:?}",
        c.binds
    );
    // The forwarder is the first process, as the sandbox's init, relays on loopback.
    let args = c.args.join(" ");
    assert!(
        args.contains(&format!(
            "127.0.0.1:3128={}",
            bwrap::PROXY_SOCKET_IN_SANDBOX
        )),
        "{args}"
    );
    assert!(args.contains(" --init -- /run/forkyard/fwd/"), "{args}");
}

#[test]
fn an_image_is_the_root_and_the_hosts_usr_is_not_bound() {
    let (c, _) = container(Some(Path::new("/images/abc/rootfs")));
    assert_eq!(c.root, Path::new("/images/abc/rootfs"));
    assert!(bind(&c, "/usr").is_none() && bind(&c, "/etc/passwd").is_none());
    assert!(c.env.contains(&("IMAGE_VAR".into(), "1".into())));
}

#[test]
fn the_config_has_no_network_no_capabilities_and_a_read_only_root() {
    let (c, _) = container(None);
    let v = c.config();
    assert_eq!(v["root"]["readonly"], true);
    let ns: Vec<&str> = v["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["type"].as_str().unwrap())
        .collect();
    assert!(
        ns.contains(&"network") && ns.contains(&"pid") && ns.contains(&"mount"),
        "{ns:?}"
    );
    for set in [
        "bounding",
        "effective",
        "permitted",
        "inheritable",
        "ambient",
    ] {
        assert_eq!(
            v["process"]["capabilities"][set],
            serde_json::json!([]),
            "{set}"
        );
    }
    assert_eq!(v["process"]["noNewPrivileges"], true);
    assert_eq!(v["process"]["cwd"], "/workspace");
    assert_eq!(v["hostname"], bwrap::HOSTNAME);
    let rl = v["process"]["rlimits"].as_array().unwrap();
    assert!(
        rl.iter()
            .any(|r| r["type"] == "RLIMIT_FSIZE" && r["hard"] == 1u64 << 30),
        "{rl:?}"
    );
    assert!(
        rl.iter()
            .any(|r| r["type"] == "RLIMIT_NOFILE" && r["soft"] == 1024 && r["hard"] == 4096),
        "{rl:?}"
    );
    let mounts = v["mounts"].as_array().unwrap();
    let ws = mounts
        .iter()
        .find(|m| m["destination"] == "/workspace")
        .unwrap();
    assert_eq!(
        ws["options"],
        serde_json::json!(["rbind", "rw", "nosuid", "nodev"])
    );
    let run = mounts.iter().find(|m| m["destination"] == RUN).unwrap();
    assert_eq!(run["options"][1], "ro");
    // runsc's own mounts: gVisor's file systems, /run/forkyard over its /run, the
    // workspace; the rest is bound on the host inside the root or /run/forkyard.
    let dests: Vec<&str> = mounts
        .iter()
        .map(|m| m["destination"].as_str().unwrap())
        .collect();
    assert_eq!(dests, ["/proc", "/dev", "/tmp", "/run", RUN, "/workspace"]);
}

#[test]
fn the_host_tools_kit_and_relays_are_bound_on_the_host_inside_the_root_or_run() {
    let (c, kit) = container(None);
    let host = c.host_binds();
    let of = |source: &str| {
        host.iter()
            .find(|(s, _, _)| s == Path::new(source))
            .map(|(_, t, w)| (t.clone(), *w))
    };
    assert_eq!(of("/usr"), Some(("/g/root/usr".into(), false)));
    assert_eq!(
        of("/etc/passwd"),
        Some(("/g/root/etc/passwd".into(), false))
    );
    assert_eq!(of(&kit), Some(("/g/run/fwd".into(), false)));
    assert_eq!(
        of("/state/sbx-1/egress.sock"),
        Some(("/g/run/egress.sock".into(), true))
    );
    // Never the workspace (the provisioner writes it from the host) or /run/forkyard.
    assert!(of("/state/sbx-1/workspace").is_none() && of("/g/run").is_none());
    // An image's root gets none: only the kit and relays, in /run/forkyard.
    let (c, _) = container(Some(Path::new("/images/abc/rootfs")));
    assert!(
        c.host_binds()
            .iter()
            .all(|(_, t, _)| t.starts_with("/g/run/")),
        "{:?}",
        c.host_binds()
    );
}

#[test]
fn mount_points_are_made_in_the_bind_that_holds_them() {
    let (c, _) = container(Some(Path::new("/images/abc/rootfs")));
    let points = c.mount_points();
    let of = |dest: &str| {
        let i = c.binds.iter().position(|b| b.dest == dest).unwrap();
        points[i].clone()
    };
    assert_eq!(
        of(RUN),
        ("/images/abc/rootfs".into(), "run/forkyard".into(), false)
    );
    assert_eq!(
        of(bwrap::PROXY_SOCKET_IN_SANDBOX),
        ("/g/run".into(), "egress.sock".into(), false)
    );
    assert_eq!(
        of("/workspace"),
        ("/images/abc/rootfs".into(), "workspace".into(), false)
    );
}

#[test]
fn a_mount_point_is_made_once_and_never_through_a_link() {
    let d = tempfile::tempdir().unwrap();
    let base = d.path().join("root");
    std::fs::create_dir(&base).unwrap();
    make_mount_point(&base, Path::new("run/forkyard/fwd"), true).unwrap();
    make_mount_point(&base, Path::new("run/forkyard/egress.sock"), false).unwrap();
    assert!(base.join("run/forkyard/fwd").is_dir());
    assert!(base.join("run/forkyard/egress.sock").is_file());
    // Again: what is there is kept.
    make_mount_point(&base, Path::new("run/forkyard/fwd"), true).unwrap();
    // A link in the way (an image's `/run -> /etc`) is refused, and nothing is made
    // where it points.
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let img = d.path().join("img");
    std::fs::create_dir(&img).unwrap();
    std::os::unix::fs::symlink(&outside, img.join("run")).unwrap();
    assert!(make_mount_point(&img, Path::new("run/forkyard"), true).is_err());
    std::os::unix::fs::symlink(&outside, img.join("ws")).unwrap();
    assert!(make_mount_point(&img, Path::new("ws"), true).is_err());
    assert!(make_mount_point(&img, Path::new("../escape"), true).is_err());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}
