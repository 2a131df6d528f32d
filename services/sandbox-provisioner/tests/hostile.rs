//! Requests an attacker would send: a caller's environment that would act on the host
//! processes starting the sandbox, and repositories that are another sandbox's work.

mod common;

use common::{eventually, exec_req, fixture, host_pids_with, unique_sleep};
use std::{path::Path, process::Command, time::Duration};
use tonic::Code;

/// A shared library whose constructor writes `marker`: run by any process that loads it.
fn evil_library(dir: &Path, marker: &Path) -> std::path::PathBuf {
    let src = dir.join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {{\n  FILE *f = fopen(\"{}\", \"a\"); if (f) {{ fputs(\"pwned\\n\", f); fclose(f); }}\n}}\n",
            marker.display()
        ),
    )
    .unwrap();
    let so = dir.join("evil.so");
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("gcc (the machine's C compiler)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

#[tokio::test]
async fn a_loader_variable_is_refused_and_nothing_runs_on_the_host() {
    let f = fixture().await;
    let sbx = f.create().await;
    // The library sits in the sandbox's workspace, where an agent could have built it.
    let ws = f.state.join("sandboxes").join(&sbx.id).join("workspace");
    let marker = f.tmp.path().join("host-marker");
    let so = evil_library(&ws, &marker);
    for (name, value) in [
        ("LD_PRELOAD", so.display().to_string()),
        ("LD_LIBRARY_PATH", ws.display().to_string()),
        ("LD_AUDIT", so.display().to_string()),
        ("GCONV_PATH", ws.display().to_string()),
    ] {
        let mut req = exec_req(&sbx.id, &["true"]);
        req.env.insert(name.into(), value);
        let err = f.core.exec(req).await.expect_err(name);
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument, "{name}: {status:?}");
        assert!(status.message().contains(name), "{}", status.message());
    }
    assert!(!marker.exists(), "a host process loaded the library");
}

#[tokio::test]
async fn the_callers_environment_reaches_only_the_sandboxed_command() {
    let f = fixture().await;
    let sbx = f.create().await;
    let secs = unique_sleep();
    let value = format!("value-{secs}");
    let mut req = exec_req(&sbx.id, &["sleep", &secs]);
    req.env.insert("CALLER_VAR".into(), value.clone());
    let core = f.core.clone();
    if common::under_gvisor() {
        return caller_env_under_gvisor(&f, &sbx.id, req, &value).await;
    }
    let running = tokio::spawn(async move { core.exec(req).await });
    let needle = format!("sleep {secs}");
    assert!(
        eventually(Duration::from_secs(10), || host_pids_with(&needle)
            .iter()
            .any(|p| cmdline(*p).starts_with("sleep")))
        .await,
        "the command never started"
    );
    let command = host_pids_with(&needle)
        .into_iter()
        .find(|p| cmdline(*p).starts_with("sleep"))
        .expect("the command's pid");
    let environ = |pid: u32| {
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default())
            .into_owned()
    };
    assert!(
        environ(command).contains(&value),
        "the command lost its variable"
    );
    // Every process between the provisioner and the command (bwrap, the sandbox's init,
    // a wrapper shell): none started with a caller's variable.
    let mut seen_host_side = 0;
    let mut pid = parent_of(command);
    while pid > 1 && pid != std::process::id() {
        let env = environ(pid);
        assert!(
            !env.contains("CALLER_VAR"),
            "{} started with the caller's environment: {env}",
            cmdline(pid)
        );
        seen_host_side += 1;
        pid = parent_of(pid);
    }
    assert!(
        seen_host_side >= 2,
        "no bwrap between the provisioner and the command"
    );
    f.core
        .destroy(forkyard_proto::sandbox::v1::DestroySandboxRequest {
            sandbox_id: sbx.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let _ = running.await;
}

/// Under gVisor the command is its kernel's: it has the caller's variable, and no host
/// process of the sandbox (runsc, its kernel, its file server) started with it.
async fn caller_env_under_gvisor(
    f: &common::Fixture,
    id: &str,
    mut req: forkyard_proto::sandbox::v1::ExecRequest,
    value: &str,
) {
    let secs = req.argv[1].clone();
    req.argv = vec![
        "sh".into(),
        "-c".into(),
        format!("echo $CALLER_VAR > seen; sleep {secs}"),
    ];
    let core = f.core.clone();
    let running = tokio::spawn(async move { core.exec(req).await });
    let seen = common::own_files(&f.state, id).join("seen");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(&seen)
            .is_ok_and(|s| s.trim() == value))
        .await,
        "the command lost its variable"
    );
    let host = host_pids_with(id);
    assert!(
        host.len() >= 3,
        "no runsc between the provisioner and the command"
    );
    for pid in host {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&env).contains("CALLER_VAR"),
            "{} started with the caller's environment",
            cmdline(pid)
        );
    }
    running.abort();
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

#[tokio::test]
async fn an_environment_over_the_documented_size_is_invalid_argument() {
    let f = fixture().await;
    let sbx = f.create().await;
    let mut req = exec_req(&sbx.id, &["true"]);
    req.env.insert("BIG".into(), "x".repeat(200 << 10));
    let status = tonic::Status::from(f.core.exec(req).await.unwrap_err());
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("invalid env: BIG"),
        "{}",
        status.message()
    );
    let mut req = exec_req(&sbx.id, &["true"]);
    for i in 0..12 {
        req.env.insert(format!("V{i}"), "x".repeat(100 << 10));
    }
    let status = tonic::Status::from(f.core.exec(req).await.unwrap_err());
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // Just under the limit still runs.
    let mut req = exec_req(&sbx.id, &["sh", "-c", "printf %s \"$BIG\" | wc -c"]);
    req.env.insert("BIG".into(), "x".repeat(100 << 10));
    let out = f.core.exec(req).await.unwrap();
    assert_eq!(out.stdout.trim(), (100 << 10).to_string(), "{}", out.stderr);
}

#[tokio::test]
async fn another_sandboxs_workspace_is_not_a_repository_by_path_or_file_url() {
    let f = fixture().await;
    let victim = f.create().await;
    let ws = f.state.join("sandboxes").join(&victim.id).join("workspace");
    let link = f.tmp.path().join("looks-innocent");
    std::os::unix::fs::symlink(&ws, &link).unwrap();
    for repo in [
        ws.display().to_string(),
        format!("file://{}", ws.display()),
        format!("file://localhost{}", ws.display()),
        format!("file://{}", link.display()),
        format!("file://{}/../workspace", ws.display()),
        f.state.join("templates").display().to_string(),
    ] {
        let mut req = f.request("forkyard-fork-2");
        req.repo = repo.clone();
        let err = f.core.create(req).await.expect_err(&repo);
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument, "{repo}: {status:?}");
    }
    // A path of its own whose git directory is another's: a `.git` file naming the
    // victim's template repository, and a bare repository borrowing its objects.
    let template_git = std::fs::read_dir(f.state.join("templates"))
        .unwrap()
        .flatten()
        .flat_map(|e| walkdir_git(&e.path()))
        .next()
        .expect("a template repository");
    let pointer = f.tmp.path().join("pointer");
    std::fs::create_dir(&pointer).unwrap();
    std::fs::write(
        pointer.join(".git"),
        format!("gitdir: {}\n", template_git.display()),
    )
    .unwrap();
    let borrower = f.tmp.path().join("borrower.git");
    common::git(
        f.tmp.path(),
        &["init", "-q", "--bare", borrower.to_str().unwrap()],
    );
    std::fs::write(
        borrower.join("objects/info/alternates"),
        format!("{}/objects\n", template_git.display()),
    )
    .unwrap();
    for repo in [
        pointer.display().to_string(),
        format!("file://{}", borrower.display()),
    ] {
        let mut req = f.request("forkyard-fork-4");
        req.repo = repo.clone();
        let status = tonic::Status::from(f.core.create(req).await.expect_err(&repo));
        assert_eq!(status.code(), Code::InvalidArgument, "{repo}: {status:?}");
        assert!(status.message().contains("leads git into"), "{status:?}");
    }
    // A file:// URL of an ordinary repository still works, resolved like a path.
    let mut req = f.request("forkyard-fork-3");
    req.repo = format!("file://{}", f.repo.display());
    let sbx = f.core.create(req).await.expect("file:// of a plain repo");
    let out = f.sh(&sbx.id, "cat README.md").await;
    assert_eq!(out.stdout, "hello\nworld\n");
}

/// The first `.git` directory at or under `dir` (a template's repository).
fn walkdir_git(dir: &Path) -> Option<std::path::PathBuf> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if d.file_name().is_some_and(|n| n == ".git") && d.join("HEAD").is_file() {
            return Some(d);
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            todo.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    None
}

#[tokio::test]
async fn egress_to_the_hosts_own_or_private_addresses_is_refused_unless_allowed() {
    let f = fixture().await;
    for bad in [
        "127.0.0.2:7233",
        "169.254.169.254",
        "[::1]:50051",
        "10.0.0.5",
        "localhost:50054",
    ] {
        let mut req = f.request("forkyard-fork-9");
        req.egress_allow = vec!["example.com".into(), bad.into()];
        let status = tonic::Status::from(f.core.create(req).await.unwrap_err());
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}: {status:?}");
        assert!(
            status
                .message()
                .contains(bad.trim_start_matches('[').split(']').next().unwrap()),
            "{}",
            status.message()
        );
    }
    // What the operator allowed (here 127.0.0.1) is taken as meant.
    let mut req = f.request("forkyard-fork-9");
    req.egress_allow = vec!["127.0.0.1:8080".into()];
    assert!(f.core.create(req).await.is_ok());
}

#[tokio::test]
async fn files_that_are_not_regular_files_are_refused_at_once() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f.sh(&sbx.id, "mkfifo pipe && mkdir dir").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    // Under gVisor a FIFO is its kernel's alone: the host has none there (a write on the
    // sandbox's behalf makes a regular file, without blocking: nothing to refuse).
    let paths: &[&str] = if common::under_gvisor() {
        let host = common::own_files(&f.state, &sbx.id).join("pipe");
        let fifo = std::fs::symlink_metadata(&host).is_ok_and(|m| !m.is_file());
        assert!(!fifo, "a FIFO on the host under gVisor");
        &["dir"]
    } else {
        &["pipe", "/workspace/pipe", "dir"]
    };
    for path in paths.iter().copied() {
        let write = f
            .core
            .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
                sandbox_id: sbx.id.clone(),
                path: path.into(),
                content: b"x".to_vec(),
                mode: 0,
            });
        let err = tokio::time::timeout(Duration::from_secs(5), write)
            .await
            .expect("a write to a FIFO blocked")
            .expect_err(path);
        assert_eq!(
            tonic::Status::from(err).code(),
            Code::InvalidArgument,
            "{path}"
        );
        let read = f
            .core
            .read_file(forkyard_proto::sandbox::v1::ReadFileRequest {
                sandbox_id: sbx.id.clone(),
                path: path.into(),
                max_bytes: 0,
            });
        let err = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("a read of a FIFO blocked")
            .expect_err(path);
        assert_eq!(
            tonic::Status::from(err).code(),
            Code::InvalidArgument,
            "{path}"
        );
    }
    // A regular file is written, replacing what was there.
    let req = |content: &[u8]| forkyard_proto::sandbox::v1::WriteFileRequest {
        sandbox_id: sbx.id.clone(),
        path: "notes.txt".into(),
        content: content.to_vec(),
        mode: 0,
    };
    f.core
        .write_file(req(b"a longer first text\n"))
        .await
        .unwrap();
    f.core.write_file(req(b"short\n")).await.unwrap();
    let out = f.sh(&sbx.id, "cat notes.txt").await;
    assert_eq!(out.stdout, "short\n");
}

#[tokio::test]
async fn limits_that_would_mean_no_limit_are_refused_at_create() {
    let f = fixture().await;
    for (field, limits) in [
        (
            "memory_bytes",
            forkyard_proto::sandbox::v1::SandboxLimits {
                memory_bytes: u64::MAX,
                ..Default::default()
            },
        ),
        (
            "pids",
            forkyard_proto::sandbox::v1::SandboxLimits {
                pids: u32::MAX,
                ..Default::default()
            },
        ),
        (
            "cpu_millis",
            forkyard_proto::sandbox::v1::SandboxLimits {
                cpu_millis: u32::MAX,
                ..Default::default()
            },
        ),
    ] {
        let mut req = f.request("forkyard-fork-7");
        req.limits = Some(limits);
        let status = tonic::Status::from(f.core.create(req).await.unwrap_err());
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert!(status.message().contains(field), "{}", status.message());
    }
    assert!(
        std::fs::read_dir(f.state.join("sandboxes"))
            .unwrap()
            .next()
            .is_none(),
        "a refused create left a sandbox"
    );
}

/// A program that makes each refused system call and prints `name errno` per line.
const SYSCALL_PROBE: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
#define TRY(name, ...) do { errno = 0; long r = syscall(__VA_ARGS__); printf("%s %d\n", name, r == -1 ? errno : 0); } while (0)
int main(void) {
  TRY("keyctl", SYS_keyctl, 0, 0, 0, 0, 0);
  TRY("add_key", SYS_add_key, "user", "k", "v", 1, -4);
  TRY("bpf", SYS_bpf, 0, 0, 0);
  TRY("userfaultfd", SYS_userfaultfd, 0);
  TRY("perf_event_open", SYS_perf_event_open, 0, 0, -1, -1, 0);
  TRY("unshare_user", SYS_unshare, CLONE_NEWUSER);
  TRY("setns", SYS_setns, -1, 0);
  TRY("mount", SYS_mount, "none", "/tmp", "tmpfs", 0, 0);
  TRY("init_module", SYS_init_module, 0, 0, "");
  TRY("clock_settime", SYS_clock_settime, 0, 0);
  TRY("clone_newuser", SYS_clone, CLONE_NEWUSER, 0, 0, 0, 0);
  TRY("clone3", SYS_clone3, 0, 0);
  TRY("getpid", SYS_getpid);
  return 0;
}
"#;

#[tokio::test]
async fn refused_system_calls_are_refused_and_real_tools_still_work() {
    let f = fixture().await;
    let sbx = f.create().await;
    f.core
        .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
            sandbox_id: sbx.id.clone(),
            path: "probe.c".into(),
            content: SYSCALL_PROBE.as_bytes().to_vec(),
            mode: 0o644,
        })
        .await
        .unwrap();
    // Compiled inside the sandbox: the host's compiler works under the filter.
    let out = f.sh(&sbx.id, "gcc -O0 -o probe probe.c && ./probe").await;
    assert_eq!(out.exit_code, 0, "{}{}", out.stdout, out.stderr);
    let results: std::collections::HashMap<&str, i32> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, e)| (n, e.parse().unwrap()))
        .collect();
    let gvisor = common::under_gvisor();
    for name in [
        "keyctl",
        "add_key",
        "bpf",
        "userfaultfd",
        "perf_event_open",
        "unshare_user",
        "setns",
        "mount",
        "init_module",
        "clock_settime",
        "clone_newuser",
    ] {
        if gvisor {
            // gVisor's kernel answers each itself (its own errno; a user namespace is
            // one of its own): none of them reaches the host's kernel or does anything
            // to the host.
            let inside = ["unshare_user", "clone_newuser"].contains(&name);
            assert!(
                inside || results.get(name).is_some_and(|e| *e != 0),
                "{name} worked under gVisor: {}",
                out.stdout
            );
            continue;
        }
        assert_eq!(
            results.get(name),
            Some(&1),
            "{name} not refused with EPERM: {}",
            out.stdout
        );
    }
    if !gvisor {
        assert_eq!(
            results.get("clone3"),
            Some(&38),
            "clone3 must be ENOSYS: {}",
            out.stdout
        );
    }
    assert_eq!(results.get("getpid"), Some(&0));

    // Threads, processes, git, python and node as usual.
    let out = f
        .sh(
            &sbx.id,
            "git status --short >/dev/null && git log -1 --format=%s && python3 -c 'import threading, subprocess; t = threading.Thread(target=lambda: None); t.start(); t.join(); print(subprocess.run([\"echo\", \"py\"], capture_output=True, text=True).stdout.strip())' && node -e 'require(\"child_process\").execSync(\"true\"); console.log(\"node\")' && (unshare -U true 2>/dev/null; echo unshare=$?)",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}{}", out.stdout, out.stderr);
    // Under gVisor, a user namespace is its kernel's own to give.
    let unshare = if gvisor { 0 } else { 1 };
    assert_eq!(
        out.stdout,
        format!("second\npy\nnode\nunshare={unshare}\n"),
        "{}",
        out.stderr
    );
}

/// What an agent would try next, once the calls above are refused: each line of the
/// script prints `ESCAPED <what>` only if the attempt worked (a sysctl is written with
/// the value it has, so a failure of the fix changes nothing on the test's host). Hard
/// links and writes into the host's read-only trees, device nodes, kernel settings (a
/// sandbox could set the host's `kernel.core_pattern` before this test), cgroup limits, the
/// host's abstract Unix sockets (X11, containerd shims and the like live there), its
/// loopback services, and files the provisioner keeps next to the workspace.
#[tokio::test]
async fn links_devices_kernel_settings_and_host_sockets_stay_out_of_reach() {
    let f = fixture().await;
    let sbx = f.create().await;
    // A host service on loopback and one on an abstract Unix socket, both listening.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let abstract_name = format!("forkyard-escape-{}", std::process::id());
    let unix = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    let script = format!(
        r#"ln /usr/bin/env hardlink 2>/dev/null && echo "ESCAPED hard link into /usr"
echo x > /usr/forkyard-escape 2>/dev/null && echo "ESCAPED write to /usr"
echo x > /etc/forkyard-escape 2>/dev/null
mknod null2 c 1 3 2>/dev/null && echo "ESCAPED device node"
[ -e /dev/sda ] || [ -e /dev/vda ] || [ -e /dev/mem ] || [ -e /dev/kmsg ] && echo "ESCAPED host devices visible"
for k in kernel/core_pattern kernel/panic kernel/randomize_va_space vm/drop_caches net/ipv4/ip_forward; do v=$(cat /proc/sys/$k 2>/dev/null); echo "$v" > /proc/sys/$k 2>/dev/null && echo "ESCAPED kernel setting $k"; done
echo 1 > /proc/sysrq-trigger 2>/dev/null && echo "ESCAPED sysrq"
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max; do echo max > $f 2>/dev/null && echo "ESCAPED cgroup limit $f"; done
ls /run/docker.sock /var/run/docker.sock 2>/dev/null && echo "ESCAPED docker socket"
ls .. 2>/dev/null | grep -q -e record -e llm -e egress && echo "ESCAPED provisioner files beside the workspace"
python3 -c 'import socket,sys; s=socket.socket(); s.settimeout(2); s.connect(("127.0.0.1",{port}))' 2>/dev/null && echo "ESCAPED host loopback"
python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect("\0{abstract_name}")' 2>/dev/null && echo "ESCAPED abstract socket"
echo tried"#
    );
    let out = f.sh(&sbx.id, &script).await;
    assert!(
        out.stdout.ends_with("tried\n"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        !out.stdout.contains("ESCAPED"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    drop((tcp, unix));
    // The sandbox's /etc is its own: nothing written there reaches the host's.
    assert!(!Path::new("/etc/forkyard-escape").exists());
}

/// The host uids (real, effective, saved, filesystem) of a command running in the
/// sandbox, as the host sees them.
async fn host_uids(f: &common::Fixture, id: &str) -> Vec<u32> {
    let sleep = unique_sleep();
    let core = f.core.clone();
    let req = exec_req(id, &["sleep", &sleep]);
    let running = tokio::spawn(async move { core.exec(req).await });
    if common::under_gvisor() {
        // The command is gVisor's; on the host, the sandbox is runsc's processes (its
        // kernel, file server and runsc itself), each as the sandbox's uid.
        assert!(
            eventually(Duration::from_secs(10), || host_pids_with(id).len() >= 3).await,
            "the sandbox's runsc never started"
        );
        let uids: Vec<Vec<u32>> = host_pids_with(id).into_iter().map(uid_line).collect();
        running.abort();
        assert!(
            uids.iter().all(|u| *u == uids[0]),
            "{uids:?}: one uid for all of runsc"
        );
        return uids[0].clone();
    }
    let marker = format!("sleep {sleep}");
    assert!(
        eventually(Duration::from_secs(10), || !host_pids_with(&marker)
            .is_empty())
        .await,
        "the command never started"
    );
    // The sandboxed sleep itself, not bwrap or the wrapper (their cmdlines hold it too).
    let pid = host_pids_with(&marker)
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
        .expect("the sleep process");
    let uids = uid_line(pid);
    running.abort();
    uids
}

/// Real, effective, saved and filesystem uids of host process `pid`.
fn uid_line(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) else {
        return Vec::new();
    };
    line.split_whitespace()
        .skip(1)
        .map(|u| u.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_sandbox_is_a_host_uid_of_its_own_and_never_root() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if !forkyard_common::testing::requires(
        forkyard_common::testing::Need::Root,
        rustix::process::geteuid().is_root(),
        "a uid per sandbox (not root, the provisioner runs sandboxes as its own uid)",
    ) {
        return;
    }
    let f = fixture().await;
    let (a, b) = (f.create().await, f.create().await);
    let (uids_a, uids_b) = (host_uids(&f, &a.id).await, host_uids(&f, &b.id).await);
    let (ua, ub) = (uids_a[0], uids_b[0]);
    assert!(
        uids_a.iter().all(|u| *u == ua) && uids_b.iter().all(|u| *u == ub),
        "{uids_a:?} {uids_b:?}: every uid of the process is the sandbox's"
    );
    assert!(
        ua >= 65_536 && ub >= 65_536,
        "{ua} {ub}: not a host user's uid"
    );
    assert_ne!(ua, ub, "two sandboxes share a host uid");

    // What the agent writes is its uid's on the host, and the workspace is its alone.
    let out = f.sh(&a.id, "echo x > made-by-agent && id -u").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let ws = common::own_files(&f.state, &a.id);
    let made = std::fs::metadata(ws.join("made-by-agent")).unwrap();
    assert_eq!((made.uid(), made.gid()), (ua, ua));
    let meta = std::fs::metadata(&ws).unwrap();
    assert_eq!(meta.uid(), ua);
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "other host users read it"
    );
    let cloned = std::fs::metadata(ws.join(".git/HEAD")).unwrap();
    assert_eq!(cloned.uid(), ua, "the clone is the sandbox's too");

    // A file written for the caller is the sandbox's: its own commands can change it.
    f.core
        .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
            sandbox_id: a.id.clone(),
            path: "from-caller.txt".into(),
            content: b"one\n".to_vec(),
            mode: 0o644,
        })
        .await
        .unwrap();
    assert_eq!(
        std::fs::metadata(ws.join("from-caller.txt")).unwrap().uid(),
        ua
    );
    let out = f
        .sh(&a.id, "echo two >> from-caller.txt && cat from-caller.txt")
        .await;
    assert_eq!(out.stdout, "one\ntwo\n", "{}", out.stderr);

    // As a host uid that owns nothing else, root's files and the other sandbox's
    // workspace are out of reach even through a host path.
    let other = common::own_files(&f.state, &b.id);
    let probe = Command::new("/usr/bin/setpriv")
        .args([format!("--reuid={ua}"), format!("--regid={ua}"), "--clear-groups".into()])
        .args(["sh", "-c"])
        .arg(format!(
            "ls {} 2>/dev/null && echo ESCAPED other sandbox; cat /etc/shadow 2>/dev/null && echo ESCAPED shadow; echo tried",
            other.display()
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&probe.stdout);
    assert!(
        said.ends_with("tried\n") && !said.contains("ESCAPED"),
        "{said}"
    );

    // A destroyed sandbox's uid is handed out again.
    f.core
        .destroy(forkyard_proto::sandbox::v1::DestroySandboxRequest {
            sandbox_id: a.id.clone(),
            reason: "test".into(),
        })
        .await
        .unwrap();
    let c = f.create().await;
    assert_eq!(host_uids(&f, &c.id).await[0], ua);
}

/// Sandboxes of one repository share its git object files: linked from the template,
/// read-only and the provisioner's (a copied workspace), or the template's own under an
/// overlay (`local::storage::overlay`). Whatever one sandbox, or a write on its behalf, does to
/// its object files, the other sandboxes' repositories stay whole: with links nothing
/// can change one; under an overlay a change is a copy in the sandbox's own layer.
#[tokio::test]
async fn a_git_object_file_shared_between_sandboxes_cannot_be_changed_by_either() {
    let f = fixture().await;
    let a = f.create().await;
    let b = f
        .core
        .create(f.request("team/x-fork-2"))
        .await
        .expect("create sandbox");
    let c = f
        .core
        .create(f.request("forkyard-fork-3"))
        .await
        .expect("create sandbox");
    let overlay = f.state.join("sandboxes").join(&a.id).join("upper").is_dir();
    // `echo` and Python's stat, not coreutils' (`ls`, `stat`): Debian 12's runsc refuses
    // their statx flags (docs/security.md), and the suite also runs under gVisor.
    let out = f.sh(&a.id, "echo .git/objects/pack/*.pack").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let pack = out.stdout.trim().to_owned();
    let ino = |pack: &str| {
        format!("python3 -c 'import os,sys; print(os.stat(sys.argv[1]).st_ino)' {pack}")
    };
    let (ino_a, ino_b, ino_c) = (
        f.sh(&a.id, &ino(&pack)).await.stdout,
        f.sh(&b.id, &ino(&pack)).await.stdout,
        f.sh(&c.id, &ino(&pack)).await.stdout,
    );
    if !forkyard_common::testing::requires(
        forkyard_common::testing::Need::Root,
        rustix::process::geteuid().is_root(),
        "git objects shared between sandboxes (not root, each has its own copy)",
    ) {
        return;
    }
    // gVisor numbers inodes itself, per sandbox: the sharing shows only from the host.
    if !common::under_gvisor() {
        assert_eq!(
            ino_a, ino_b,
            "as root, sandboxes share the template's object files"
        );
    }
    let sum = format!("sha256sum {pack}");
    let before = f.sh(&c.id, &sum).await.stdout;
    for script in [
        format!("printf x >> {pack}"),
        format!("chmod u+w {pack}"),
        format!("truncate -s 0 {pack}"),
    ] {
        let out = f.sh(&a.id, &script).await;
        if !overlay {
            assert_ne!(out.exit_code, 0, "{script} changed a shared object file");
        }
    }
    let written = f
        .core
        .write_file(forkyard_proto::sandbox::v1::WriteFileRequest {
            sandbox_id: a.id.clone(),
            path: pack.clone(),
            content: b"garbage".to_vec(),
            mode: 0o644,
        })
        .await;
    if overlay {
        written.expect("the sandbox's own copy of the file");
        assert_eq!(f.sh(&a.id, &format!("cat {pack}")).await.stdout, "garbage");
    } else {
        let status = tonic::Status::from(written.expect_err("a write on the sandbox's behalf"));
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    }
    assert_eq!(
        f.sh(&c.id, &sum).await.stdout,
        before,
        "another sandbox's object file changed"
    );
    // Its own repository is the sandbox's to rewrite: a commit on its branch (under
    // `team/`, a directory the create made), a repack that drops its link.
    let out = f
        .sh(
            &b.id,
            "echo mine > README.md && git -c user.name=a -c user.email=a@b commit -qam mine \
             && git gc -q --prune=now && git fsck --no-progress",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let out = f
        .sh(&c.id, "git fsck --no-progress && git status --porcelain")
        .await;
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, ""),
        "{}",
        out.stderr
    );
    let out = f.sh(&c.id, &ino(&pack)).await;
    assert_eq!(out.stdout, ino_c, "sandbox c's object file is as it was");
}
