//! `isolation: gvisor`: a sandbox whose commands run on gVisor's kernel (the real
//! `runsc`, Debian's package), with the same workspace, files, patches, relays and
//! limits as a bubblewrap sandbox; refused, saying why, where runsc cannot run.

mod common;

use common::{exec_req, fixture, fixture_with};
use forkyard_common::testing::{Need, requires};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, DestroySandboxRequest, ExecResponse, ReadFileRequest, Sandbox,
    WriteFileRequest, exec_event::Event,
};
use std::{path::Path, time::Duration};

fn has_runsc() -> bool {
    let found = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
        .iter()
        .any(|p| Path::new(p).exists());
    requires(Need::Installed("runsc"), found, "gVisor sandboxes")
}

async fn gvisor_sandbox(
    f: &common::Fixture,
    tweak: impl FnOnce(&mut forkyard_proto::sandbox::v1::CreateSandboxRequest),
) -> Sandbox {
    let mut req = f.request("forkyard-fork-1");
    req.isolation = "gvisor".into();
    tweak(&mut req);
    let sbx = f.core.create(req).await.expect("create a gVisor sandbox");
    assert_eq!(sbx.isolation, "gvisor");
    sbx
}

/// Host processes whose command line names `what` (runsc's carry the sandbox's id).
fn host_processes_naming(what: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(what))
        .collect()
}

fn ok(out: &ExecResponse) {
    assert_eq!(out.exit_code, 0, "{out:?}");
}

#[tokio::test]
async fn a_gvisor_sandbox_runs_on_gvisors_kernel_with_its_workspace_files_and_patch() {
    if !has_runsc() {
        return;
    }
    let f = fixture().await;
    let started = std::time::Instant::now();
    let sbx = gvisor_sandbox(&f, |_| {}).await;
    let created = started.elapsed();
    // The kernel is gVisor's: its own release and boot log, not the host's.
    let out = f.sh(&sbx.id, "uname -r; dmesg").await;
    ok(&out);
    let first_exec = started.elapsed() - created;
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(
        out.stdout.lines().next().unwrap(),
        host_release.trim(),
        "{out:?}"
    );
    assert!(out.stdout.contains("Starting gVisor"), "{out:?}");
    eprintln!("gvisor: create {created:?}, first exec {first_exec:?}");

    // The workspace at /workspace, the repository's files in it, writable.
    let out = f.sh(&sbx.id, "pwd; cat README.md; echo changed >> README.md; echo new > added.txt; git status --short").await;
    ok(&out);
    assert!(
        out.stdout.starts_with("/workspace\nhello\nworld\n"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains(" M README.md") && out.stdout.contains("?? added.txt"),
        "{out:?}"
    );

    // Files through the API, both ways.
    f.core
        .write_file(WriteFileRequest {
            sandbox_id: sbx.id.clone(),
            path: "from_api.txt".into(),
            content: b"written by the API\n".to_vec(),
            mode: 0,
        })
        .await
        .unwrap();
    let out = f
        .sh(&sbx.id, "cat from_api.txt && echo inside > inside.txt")
        .await;
    assert_eq!(out.stdout, "written by the API\n", "{out:?}");
    let read = f
        .core
        .read_file(ReadFileRequest {
            sandbox_id: sbx.id.clone(),
            path: "inside.txt".into(),
            max_bytes: 0,
        })
        .await
        .unwrap();
    assert_eq!(read.content, b"inside\n");
    // What the sandbox wrote is its own uid's on the host, never root's.
    let own = common::own_files(&f.state, &sbx.id).join("added.txt");
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&own).unwrap());
    if forkyard_common::testing::is_root() {
        assert!(uid >= 65_536, "a file the sandbox wrote is uid {uid}'s");
    }

    // A streamed exec, and the patch.
    let mut rx = f
        .core
        .exec_stream(exec_req(
            &sbx.id,
            &["sh", "-c", "echo one; echo two >&2; exit 3"],
        ))
        .await
        .unwrap();
    let (mut stdout, mut stderr, mut exit) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = rx.recv().await {
        match ev.event {
            Some(Event::Stdout(b)) => stdout.extend(b),
            Some(Event::Stderr(b)) => stderr.extend(b),
            Some(Event::Exit(e)) => exit = Some(e.exit_code),
            None => {}
        }
    }
    assert_eq!(
        (stdout, stderr, exit),
        (b"one\n".to_vec(), b"two\n".to_vec(), Some(3))
    );
    let patch = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        patch.patch.contains("+changed") && patch.patch.contains("+new"),
        "{}",
        patch.patch
    );
    assert!(patch.patch.contains("b/from_api.txt"), "{}", patch.patch);

    // Destroy leaves no runsc process and no file of it.
    assert!(
        !host_processes_naming(&sbx.id).is_empty(),
        "no runsc process names the sandbox"
    );
    destroy(&f, &sbx.id).await;
    assert!(
        common::eventually(Duration::from_secs(10), || host_processes_naming(&sbx.id)
            .is_empty())
        .await,
        "runsc processes outlived the destroy: {:?}",
        host_processes_naming(&sbx.id)
    );
    assert!(!f.state.join("sandboxes").join(&sbx.id).exists());
}

async fn destroy(f: &common::Fixture, id: &str) {
    f.core
        .destroy(DestroySandboxRequest {
            sandbox_id: id.into(),
            reason: "test".into(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn gvisor_where_runsc_is_missing_is_failed_precondition_naming_why() {
    let missing = std::env::temp_dir().join("no-such-dir/runsc");
    let f = fixture_with(|_, c| c.runsc_path = missing.clone()).await;
    let mut req = f.request("forkyard-fork-1");
    req.isolation = "gvisor".into();
    let err = tonic::Status::from(f.core.create(req).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("runsc") && err.message().contains("no-such-dir/runsc"),
        "{}",
        err.message()
    );
    assert!(
        f.sandbox_dirs().is_empty(),
        "a refused create left {:?}",
        f.sandbox_dirs()
    );
    // Bubblewrap sandboxes are not affected.
    let sbx = f.create().await;
    assert_eq!(sbx.isolation, "bubblewrap");
}

#[tokio::test]
async fn an_unknown_isolation_is_invalid_argument_naming_the_field() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.isolation = "firecracker".into();
    let err = tonic::Status::from(f.core.create(req).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("isolation") && err.message().contains("gvisor"),
        "{}",
        err.message()
    );
}

/// A tiny HTTP server on 127.0.0.1 answering every request with `body` and the request
/// line it got.
async fn http_server(body: &'static str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                let line = head.lines().next().unwrap_or_default().to_owned();
                let reply = format!("{body} {line}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                    reply.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn egress_and_the_llm_relay_are_the_only_ways_out_of_a_gvisor_sandbox() {
    if !has_runsc() {
        return;
    }
    let allowed = http_server("allowed").await;
    let other = http_server("must not be reached").await;
    let llm = http_server("llm").await;
    let f = fixture().await;
    let sbx = gvisor_sandbox(&f, |req| {
        req.network = true;
        req.egress_allow = vec![format!("127.0.0.1:{allowed}")];
    })
    .await;
    // Through the egress proxy (HTTP_PROXY in the sandbox): the listed host only.
    let curl =
        |port: u16| format!("NO_PROXY= no_proxy= curl -sS --max-time 10 http://127.0.0.1:{port}/x");
    let out = f.sh(&sbx.id, &curl(allowed)).await;
    assert_eq!(out.stdout, "allowed GET /x HTTP/1.1", "{out:?}");
    let out = f
        .sh(&sbx.id, &format!("{} -w '%{{http_code}}'", curl(other)))
        .await;
    assert!(
        out.stdout.ends_with("403") && !out.stdout.contains("must not"),
        "{out:?}"
    );
    // Not around it: gVisor's network is its loopback, the host's is not there.
    let direct =
        format!("curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:{other}/ 2>&1; echo rc=$?");
    let out = f.sh(&sbx.id, &direct).await;
    assert!(
        !out.stdout.contains("must not") && !out.stdout.contains("rc=0"),
        "{out:?}"
    );
    // The LLM relay: the command's gateway at FORKYARD_LLM_URL, while it runs.
    let mut req = exec_req(
        &sbx.id,
        &[
            "sh",
            "-c",
            "curl -sS --max-time 10 \"$FORKYARD_LLM_URL/v1/messages\"",
        ],
    );
    req.llm_gateway = format!("http://127.0.0.1:{llm}");
    let out = f.core.exec(req).await.unwrap();
    assert!(out.stdout.starts_with("llm "), "{out:?}");
    destroy(&f, &sbx.id).await;
}

/// The runsc container ids (`<sandbox>-<8 hex>`, one per start of the sandbox's init)
/// that host processes name.
fn containers_of(id: &str) -> std::collections::BTreeSet<String> {
    host_processes_naming(id)
        .iter()
        .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|w| {
            w.strip_prefix(id)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|r| r.len() == 8 && r.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .collect()
}

/// A gVisor sandbox's container boots as soon as it is made, before any command (its
/// start then overlaps what its caller does before the first one); the first command
/// runs in that container, not a second one; a sandbox destroyed before any command
/// leaves no runsc process.
#[tokio::test]
async fn a_gvisor_sandbox_boots_at_its_create_and_its_first_command_runs_there() {
    if !has_runsc() {
        return;
    }
    let f = fixture().await;
    let sbx = gvisor_sandbox(&f, |_| {}).await;
    assert!(
        common::eventually(Duration::from_secs(20), || containers_of(&sbx.id).len()
            == 1)
        .await,
        "no runsc container started at the create: {:?}",
        host_processes_naming(&sbx.id)
    );
    let booted = containers_of(&sbx.id);
    ok(&f.sh(&sbx.id, "uname -r").await);
    assert_eq!(
        containers_of(&sbx.id),
        booted,
        "the first command started another container"
    );

    let unused = gvisor_sandbox(&f, |r| r.branch = "forkyard-fork-2".into()).await;
    destroy(&f, &unused.id).await;
    assert!(
        common::eventually(Duration::from_secs(10), || host_processes_naming(
            &unused.id
        )
        .is_empty())
        .await,
        "runsc processes outlived the destroy of a sandbox never used: {:?}",
        host_processes_naming(&unused.id)
    );
    destroy(&f, &sbx.id).await;
}
