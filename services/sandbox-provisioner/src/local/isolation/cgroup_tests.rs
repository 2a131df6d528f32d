//! The cgroup logic that does not need a real hierarchy: choosing v1/v2 from mountinfo
//! texts, and the files written into a temp dir laid out like a cgroup tree. (The kernel
//! side — limits enforced, `cgroup.kill` emptying a group — is covered on this host's v1
//! by tests/limits.rs and tests/isolation.rs.)

use super::*;
use crate::local::isolation::cgroup_detect::{Mount, choose, parse_mountinfo};

/// This build host: v1 controllers one per mount, a controller-less v2 at `unified`.
const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

/// A systemd host on the unified hierarchy (the production case).
const UNIFIED: &str = "\
22 26 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
29 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

/// A container with its own cgroup namespace: the mount's root is its own subtree.
const CONTAINER: &str = "\
612 600 0:26 /docker/4f1c /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup ro
";

/// Older distributions: cpu and cpuacct co-mounted, and a mount point with a space.
const COMOUNTED: &str = r"
25 18 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:7 - cgroup cgroup rw,cpu,cpuacct
26 18 0:23 / /sys/fs/cgroup/memory rw,nosuid shared:8 - cgroup cgroup rw,memory
27 18 0:24 / /sys/fs/cgroup/pids rw,nosuid shared:9 - cgroup cgroup rw,pids
28 18 0:25 / /srv/cg\040freezer rw,nosuid shared:10 - cgroup cgroup rw,freezer
";

const ALL_V2: &str = "cpuset cpu io memory hugetlb pids rdma misc";

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

#[test]
fn hybrid_host_uses_v1_because_unified_has_no_controllers() {
    let mounts = parse_mountinfo(HYBRID);
    assert_eq!(mounts.len(), 7, "{mounts:?}");
    let layout = choose(&mounts, |_| Some(String::new())).unwrap();
    assert_eq!(
        layout,
        Layout::V1 {
            mounts: ["memory", "pids", "cpu", "freezer"]
                .iter()
                .map(|c| p(&format!("/sys/fs/cgroup/{c}")))
                .collect()
        }
    );
}

#[test]
fn unified_host_and_container_use_v2_at_the_mount_point() {
    let seen = std::cell::RefCell::new(Vec::new());
    let layout = choose(&parse_mountinfo(UNIFIED), |d| {
        seen.borrow_mut().push(d.to_path_buf());
        Some(ALL_V2.into())
    })
    .unwrap();
    assert_eq!(
        layout,
        Layout::V2 {
            root: p("/sys/fs/cgroup")
        }
    );
    assert_eq!(seen.into_inner(), [p("/sys/fs/cgroup")]);
    let layout = choose(&parse_mountinfo(CONTAINER), |_| Some(ALL_V2.into())).unwrap();
    assert_eq!(
        layout,
        Layout::V2 {
            root: p("/sys/fs/cgroup")
        }
    );
}

#[test]
fn comounted_v1_controllers_and_escaped_mount_points() {
    let mounts = parse_mountinfo(COMOUNTED);
    assert_eq!(
        mounts[0],
        Mount {
            point: p("/sys/fs/cgroup/cpu,cpuacct"),
            v2: false,
            controllers: vec!["cpu".into(), "cpuacct".into()],
        }
    );
    let Layout::V1 { mounts } = choose(&mounts, |_| None).unwrap() else {
        panic!("v1 expected")
    };
    assert_eq!(mounts[2], p("/sys/fs/cgroup/cpu,cpuacct"));
    assert_eq!(mounts[3], p("/srv/cg freezer"));
}

#[test]
fn missing_controllers_are_named() {
    // v2 without cpu (bound to v1 or disabled), and no complete v1 either.
    let err = choose(&parse_mountinfo(UNIFIED), |_| Some("memory pids".into())).unwrap_err();
    assert!(err.contains("lacks cpu"), "{err}");
    assert!(
        err.contains("not mounted: memory, pids, cpu, freezer"),
        "{err}"
    );
    let err = choose(&parse_mountinfo(""), |_| None).unwrap_err();
    assert!(err.contains("no cgroup v2 mount"), "{err}");
}

fn read(d: &Path, f: &str) -> String {
    std::fs::read_to_string(d.join(f)).unwrap_or_else(|e| panic!("{}: {e}", d.join(f).display()))
}

#[test]
fn v2_tree_gets_controllers_enabled_and_limit_files_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::write(root.join("cgroup.controllers"), ALL_V2).unwrap();
    let cg = Cgroups::setup(&Layout::V2 { root: root.into() }, "forkyard/0123abcd").unwrap();
    assert_eq!(cg.version, Version::V2);
    // Every level from the root down to the sandboxes' parent delegates the controllers.
    for level in ["", "forkyard", "forkyard/0123abcd"] {
        assert_eq!(
            read(&root.join(level), "cgroup.subtree_control"),
            "+memory +pids +cpu"
        );
    }
    // The start-up probe wrote its limits there too.
    let probe = root.join("forkyard/0123abcd/probe");
    assert_eq!(read(&probe, "pids.max"), "16");
    assert_eq!(read(&probe, "cpu.max"), "50000 100000");

    let limits = Limits {
        memory_bytes: 256 << 20,
        pids: 64,
        cpu_millis: 1500,
    };
    cg.create("sbx-1", limits).unwrap();
    let d = root.join("forkyard/0123abcd/sbx-1");
    assert_eq!(read(&d, "memory.max"), "268435456");
    assert_eq!(read(&d, "memory.swap.max"), "0");
    assert_eq!(read(&d, "pids.max"), "64");
    assert_eq!(read(&d, "cpu.max"), "150000 100000");
    assert_eq!(cg.join_files("sbx-1"), [d.join("cgroup.procs")]);

    cg.create("sbx-2", Limits::default()).unwrap();
    let d2 = root.join("forkyard/0123abcd/sbx-2");
    assert_eq!(read(&d2, "memory.max"), "max");
    assert_eq!(read(&d2, "pids.max"), "max");
    assert_eq!(read(&d2, "cpu.max"), "max 100000");

    std::fs::write(
        d.join("memory.events"),
        "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n",
    )
    .unwrap();
    assert_eq!(cg.oom_kills("sbx-1"), 1);
    std::fs::write(d.join("cgroup.procs"), "").unwrap();
    cg.kill_all("sbx-1");
    assert_eq!(
        read(&d, "cgroup.kill"),
        "1",
        "destroy kills through cgroup.kill"
    );
    let mut ids = cg.list();
    ids.sort();
    assert_eq!(ids, ["probe", "sbx-1", "sbx-2"]);
}

#[test]
fn v2_subtree_control_refused_is_a_readable_error() {
    let tmp = tempfile::tempdir().unwrap();
    // A directory where the file should be: the write fails like a refused one.
    std::fs::create_dir_all(tmp.path().join("cgroup.subtree_control")).unwrap();
    let err = Cgroups::setup(
        &Layout::V2 {
            root: tmp.path().into(),
        },
        "forkyard",
    )
    .unwrap_err();
    assert!(
        err.contains("cannot enable memory, pids and cpu controllers"),
        "{err}"
    );
}

#[test]
fn v1_tree_gets_limit_files_in_each_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let mounts: Vec<PathBuf> = V1_CONTROLLERS.iter().map(|c| tmp.path().join(c)).collect();
    for m in &mounts {
        std::fs::create_dir_all(m).unwrap();
        std::fs::write(m.join("cgroup.procs"), "").unwrap();
    }
    let cg = Cgroups::setup(
        &Layout::V1 {
            mounts: mounts.clone(),
        },
        "forkyard/x",
    )
    .unwrap();
    assert_eq!(cg.version, Version::V1);
    cg.create(
        "sbx-1",
        Limits {
            memory_bytes: 1 << 30,
            pids: 100,
            cpu_millis: 250,
        },
    )
    .unwrap();
    let at = |i: usize| mounts[i].join("forkyard/x/sbx-1");
    assert_eq!(read(&at(0), "memory.limit_in_bytes"), "1073741824");
    assert_eq!(read(&at(1), "pids.max"), "100");
    assert_eq!(read(&at(2), "cpu.cfs_quota_us"), "25000");
    assert_eq!(read(&at(2), "cpu.cfs_period_us"), "100000");
    let joins = cg.join_files("sbx-1");
    assert_eq!(joins.len(), 4);
    // v1: the single-threaded child moves itself through `tasks` (no global lock).
    assert!(
        joins.iter().all(|f| f.ends_with("sbx-1/tasks")),
        "{joins:?}"
    );
}
