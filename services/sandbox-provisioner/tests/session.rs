//! Session API: files, streamed exec, stop/start, snapshots (persist, fork, hydrate).

mod common;

use common::{exec_req, fixture};
use forkyard_proto::sandbox::v1::{
    ForkSandboxRequest, HydrateWorkspaceRequest, PersistWorkspaceRequest, ReadFileRequest,
    StartSandboxRequest, StopSandboxRequest, WriteFileRequest, exec_event::Event,
};

#[tokio::test]
async fn files_are_read_and_written_inside_the_workspace_only() {
    let f = fixture().await;
    let sbx = f.create().await;
    let w = WriteFileRequest {
        sandbox_id: sbx.id.clone(),
        path: "notes.txt".into(),
        content: b"hi\n".to_vec(),
        mode: 0,
    };
    f.core.write_file(w).await.unwrap();
    assert_eq!(f.sh(&sbx.id, "cat notes.txt").await.stdout, "hi\n");
    let r = |path: &str| ReadFileRequest {
        sandbox_id: sbx.id.clone(),
        path: path.into(),
        max_bytes: 0,
    };
    assert_eq!(
        f.core
            .read_file(r("/workspace/README.md"))
            .await
            .unwrap()
            .content,
        b"hello\nworld\n"
    );
    // A planted symlink resolves inside the workspace, never to the host's file.
    let secret = f.tmp.path().join("host-secret");
    std::fs::write(&secret, "host secret").unwrap();
    f.sh(
        &sbx.id,
        &format!(
            "ln -s {} escape; ln -s ../../../../../../etc/hostname up",
            secret.display()
        ),
    )
    .await;
    for p in ["escape", "up", "../../../../etc/hostname"] {
        let res = f.core.read_file(r(p)).await;
        assert!(
            res.as_ref()
                .map_or(true, |x| !String::from_utf8_lossy(&x.content)
                    .contains("host secret")),
            "{p}: {res:?}"
        );
        assert!(res.is_err(), "{p} resolved: {res:?}");
    }
    let w = WriteFileRequest {
        sandbox_id: sbx.id.clone(),
        path: "escape".into(),
        content: b"x".to_vec(),
        mode: 0,
    };
    assert!(f.core.write_file(w).await.is_err());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
}

#[tokio::test]
async fn exec_stream_delivers_output_then_the_exit() {
    let f = fixture().await;
    let sbx = f.create().await;
    let mut rx = f
        .core
        .exec_stream(exec_req(
            &sbx.id,
            &["sh", "-c", "echo a; echo b >&2; exit 4"],
        ))
        .await
        .unwrap();
    let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = rx.recv().await {
        match ev.event.unwrap() {
            Event::Stdout(b) => out.extend(b),
            Event::Stderr(b) => err.extend(b),
            Event::Exit(e) => exit = Some(e),
        }
    }
    assert_eq!(out, b"a\n");
    assert_eq!(err, b"b\n");
    assert_eq!(exit.unwrap().exit_code, 4);
}

#[tokio::test]
async fn stopped_sandboxes_refuse_commands_until_started() {
    let f = fixture().await;
    let sbx = f.create().await;
    let stopped = f
        .core
        .stop(StopSandboxRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        stopped.state,
        forkyard_proto::sandbox::v1::SandboxState::Stopped as i32
    );
    let sel =
        std::collections::HashMap::from([("forkyard.state".to_owned(), "stopped".to_owned())]);
    assert_eq!(f.core.list(&sel).len(), 1);
    let err = tonic::Status::from(f.core.exec(exec_req(&sbx.id, &["true"])).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    f.core
        .start(StartSandboxRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(f.sh(&sbx.id, "echo ok").await.stdout, "ok\n");
}

#[tokio::test]
async fn persist_fork_and_hydrate_through_the_snapshot_store() {
    let f = fixture().await;
    let sbx = f.create().await;
    f.sh(&sbx.id, "echo v1 > state.txt").await;
    let snap = f
        .core
        .persist(PersistWorkspaceRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    assert!(snap.snapshot_id.starts_with("snap-") && snap.bytes > 0);
    assert!(
        f.state
            .join("snapshots")
            .join(format!("{}.tar.gz", snap.snapshot_id))
            .is_file()
    );

    let forks = f
        .core
        .fork(ForkSandboxRequest {
            snapshot_id: snap.snapshot_id.clone(),
            count: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(forks.sandboxes.len(), 3);
    for s in &forks.sandboxes {
        assert_eq!(s.base_commit, sbx.base_commit);
        assert_eq!(
            f.sh(&s.id, "cat state.txt; git status --short")
                .await
                .stdout,
            "v1\n?? state.txt\n"
        );
    }
    f.sh(&sbx.id, "echo v2 > state.txt").await;
    let h = HydrateWorkspaceRequest {
        sandbox_id: sbx.id.clone(),
        snapshot_id: snap.snapshot_id.clone(),
    };
    f.core.hydrate(h).await.unwrap();
    assert_eq!(f.sh(&sbx.id, "cat state.txt").await.stdout, "v1\n");
    let bad = HydrateWorkspaceRequest {
        sandbox_id: sbx.id.clone(),
        snapshot_id: "../x".into(),
    };
    assert_eq!(
        tonic::Status::from(f.core.hydrate(bad).await.unwrap_err()).code(),
        tonic::Code::InvalidArgument
    );

    // A snapshot that is not there is refused before the sandbox loses anything: what
    // it has running goes on. The beat is waited for: once it is written, `setsid` has
    // taken the loop out of the command's process group (killed when the command ends).
    f.sh(
        &sbx.id,
        "setsid sh -c 'while :; do date +%s%N > .beat; sleep 0.05; done' >/dev/null 2>&1 &
         for i in $(seq 2000); do [ -s .beat ] && break; sleep 0.01; done",
    )
    .await;
    let missing = HydrateWorkspaceRequest {
        sandbox_id: sbx.id.clone(),
        snapshot_id: "snap-0000".into(),
    };
    assert_eq!(
        tonic::Status::from(f.core.hydrate(missing).await.unwrap_err()).code(),
        tonic::Code::NotFound
    );
    let beat = f
        .sh(
            &sbx.id,
            r#"b=$(cat .beat); [ -n "$b" ] || { echo never; exit; }
               for i in $(seq 2000); do [ "$(cat .beat)" != "$b" ] && { echo beats; exit; }; sleep 0.01; done
               echo stopped"#,
        )
        .await
        .stdout;
    assert_eq!(beat, "beats\n", "the sandbox's process does not run on");
    assert_eq!(f.sh(&sbx.id, "cat state.txt").await.stdout, "v1\n");
}
