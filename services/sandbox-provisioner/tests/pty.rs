//! Commands on a pseudo-terminal in a local sandbox, over the gRPC service: an
//! interactive `sh` echoes what is written, a resize shows in `stty size`, hanging up
//! and destroying kill the command.

mod common;

use common::{eventually, fixture, host_pids_with, unique_sleep};
use forkyard_proto::sandbox::v1::{
    DestroySandboxRequest, PtyEvent, ResizePtyRequest, StartPtyRequest, WritePtyRequest,
    pty_event::Event, sandbox_provisioner_server::SandboxProvisioner,
};
use forkyard_sandbox_provisioner::SandboxService;
use futures::StreamExt;
use std::time::Duration;
use tonic::{Code, Request};

type Events =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<PtyEvent, tonic::Status>> + Send>>;

/// Read output until it contains `want`; returns everything read.
async fn until(events: &mut Events, want: &str) -> String {
    let mut seen = String::new();
    let res = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = events.next().await {
            match ev.unwrap().event.unwrap() {
                Event::Output(b) => {
                    seen.push_str(&String::from_utf8_lossy(&b));
                    if seen.contains(want) {
                        return;
                    }
                }
                other => panic!("unexpected {other:?} before {want:?}; output {seen:?}"),
            }
        }
    })
    .await;
    assert!(res.is_ok(), "no {want:?} in {seen:?}");
    seen
}

async fn start(svc: &SandboxService, id: &str) -> (Events, String) {
    let mut events: Events = svc
        .start_pty(Request::new(StartPtyRequest {
            sandbox_id: id.into(),
            argv: vec!["sh".into()],
            rows: 24,
            cols: 80,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(PtyEvent {
        event: Some(Event::PtyId(pty)),
    })) = events.next().await
    else {
        panic!("the first event names the pty")
    };
    (events, pty)
}

#[tokio::test]
async fn interactive_shell_echoes_resizes_and_exits() {
    let f = fixture().await;
    let sbx = f.create().await;
    let svc = SandboxService::new(f.core.clone());
    let (mut events, pty) = start(&svc, &sbx.id).await;
    let write = |data: &str| WritePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.clone(),
        data: data.as_bytes().to_vec(),
    };

    svc.write_pty(Request::new(write("echo hel''lo-$((6*7))\n")))
        .await
        .unwrap();
    let out = until(&mut events, "hello-42").await;
    assert!(
        out.contains("echo hel''lo"),
        "the tty echoes the input: {out:?}"
    );

    svc.write_pty(Request::new(write("stty size\n")))
        .await
        .unwrap();
    until(&mut events, "24 80").await;
    svc.resize_pty(Request::new(ResizePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.clone(),
        rows: 40,
        cols: 120,
    }))
    .await
    .unwrap();
    // Up to a marker printed after both answers (a wait that ended at "40 120" passed
    // whatever `tty` said after it). The terminal is the sandbox's own: `tty` finds its
    // name in the sandbox's /dev/pts.
    svc.write_pty(Request::new(write("stty size; tty; echo tty-$((40+2))\n")))
        .await
        .unwrap();
    let out = until(&mut events, "tty-42").await;
    assert!(out.contains("40 120"), "{out:?}");
    assert!(!out.contains("not a tty"), "{out:?}");
    assert!(out.contains("/dev/pts/"), "{out:?}");

    svc.write_pty(Request::new(write("exit 7\n")))
        .await
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = events.next().await {
            if let Some(Event::Exit(e)) = ev.unwrap().event {
                return e;
            }
        }
        panic!("no exit event")
    })
    .await
    .unwrap();
    assert_eq!(exit.exit_code, 7);
    assert!(!exit.timed_out);
    // the pty is gone with its command
    let err = svc
        .write_pty(Request::new(write("echo x\n")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = svc
        .resize_pty(Request::new(ResizePtyRequest {
            sandbox_id: sbx.id.clone(),
            pty_id: pty.clone(),
            rows: 0,
            cols: 1,
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn hang_up_and_destroy_kill_the_pty_command() {
    let f = fixture().await;
    let sbx = f.create().await;
    let svc = SandboxService::new(f.core.clone());

    // hang-up: drop the stream
    let (mut events, pty) = start(&svc, &sbx.id).await;
    let marker = unique_sleep();
    svc.write_pty(Request::new(WritePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.clone(),
        data: format!("sleep {marker} & echo started\n").into_bytes(),
    }))
    .await
    .unwrap();
    until(&mut events, "started\r\n").await;
    assert!(
        eventually(Duration::from_secs(10), || !host_pids_with(&marker)
            .is_empty())
        .await
    );
    drop(events);
    assert!(
        eventually(Duration::from_secs(10), || host_pids_with(&marker)
            .is_empty())
        .await,
        "hang-up kills the pty's command"
    );

    // destroy
    let (mut events, pty) = start(&svc, &sbx.id).await;
    let marker = unique_sleep();
    svc.write_pty(Request::new(WritePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty,
        data: format!("sleep {marker} & echo started\n").into_bytes(),
    }))
    .await
    .unwrap();
    until(&mut events, "started\r\n").await;
    svc.destroy_sandbox(Request::new(DestroySandboxRequest {
        sandbox_id: sbx.id.clone(),
        reason: "test".into(),
    }))
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || host_pids_with(&marker)
            .is_empty())
        .await,
        "destroy kills the pty's command"
    );
}

/// Wait for the exit event, skipping output.
async fn exit_of(events: &mut Events) -> forkyard_proto::sandbox::v1::ExecResponse {
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = events.next().await {
            if let Some(Event::Exit(e)) = ev.unwrap().event {
                return e;
            }
        }
        panic!("no exit event")
    })
    .await
    .expect("the command exits")
}

async fn start_argv(svc: &SandboxService, id: &str, argv: &[&str]) -> (Events, String) {
    let mut events: Events = svc
        .start_pty(Request::new(StartPtyRequest {
            sandbox_id: id.into(),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            rows: 24,
            cols: 80,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(PtyEvent {
        event: Some(Event::PtyId(pty)),
    })) = events.next().await
    else {
        panic!("the first event names the pty")
    };
    (events, pty)
}

#[tokio::test]
async fn ctrl_c_interrupts_and_resize_signals_the_foreground_command() {
    ctrl_c_and_resize(&common::isolation()).await;
}

/// The same under gVisor, where the terminal is one of gVisor's devpts that the
/// sandbox's init relays (a terminal passed in from the host is a plain file there).
#[tokio::test]
async fn under_gvisor_ctrl_c_interrupts_and_resize_signals_the_foreground_command() {
    let found = std::path::Path::new("/usr/bin/runsc").exists();
    if forkyard_common::testing::requires(
        forkyard_common::testing::Need::Installed("runsc"),
        found,
        "gVisor sandboxes",
    ) {
        ctrl_c_and_resize("gvisor").await;
    }
}

/// Whether a process whose command line starts with `prefix` runs in the sandbox (seen
/// from inside: under gVisor its processes are not the host's), within 10 s.
async fn runs_in_sandbox(f: &common::Fixture, id: &str, prefix: &str) -> bool {
    let pattern = format!("^{prefix}");
    for _ in 0..100 {
        let out = f
            .core
            .exec(common::exec_req(id, &["pgrep", "-f", &pattern]))
            .await;
        if out.is_ok_and(|o| o.exit_code == 0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn ctrl_c_and_resize(isolation: &str) {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.isolation = isolation.into();
    let sbx = f.core.create(req).await.expect("create");
    let svc = SandboxService::new(f.core.clone());
    let write = |pty: &str, data: &str| WritePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.to_owned(),
        data: data.as_bytes().to_vec(),
    };

    // ^C kills a running `sleep`: SIGINT, reported as 128 + 2.
    let (mut events, pty) =
        start_argv(&svc, &sbx.id, &["sh", "-c", "echo armed; exec sleep 300"]).await;
    // Output means the terminal is set up (a ^C typed earlier would be plain input).
    until(&mut events, "armed").await;
    svc.write_pty(Request::new(write(&pty, "\x03")))
        .await
        .unwrap();
    let exit = exit_of(&mut events).await;
    assert_eq!(exit.exit_code, 130, "{exit:?}");
    assert!(!exit.timed_out);

    // ^C reaches the whole foreground process group: the `sleep` dies of it, the script
    // that traps it goes on. (The marker comes through the environment so that only
    // `sleep`'s command line carries it.)
    let nap = unique_sleep();
    let script = "trap 'echo script-got-int' INT; sleep \"$NAP\"; echo sleep-exit-$?";
    let mut events: Events = svc
        .start_pty(Request::new(StartPtyRequest {
            sandbox_id: sbx.id.clone(),
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: [("NAP".to_owned(), nap.clone())].into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(PtyEvent {
        event: Some(Event::PtyId(pty)),
    })) = events.next().await
    else {
        panic!("the first event names the pty")
    };
    assert!(
        runs_in_sandbox(&f, &sbx.id, &format!("sleep {nap}")).await,
        "sleep started"
    );
    svc.write_pty(Request::new(write(&pty, "\x03")))
        .await
        .unwrap();
    let out = until(&mut events, "sleep-exit-130").await;
    assert!(out.contains("script-got-int"), "{out:?}");
    assert_eq!(exit_of(&mut events).await.exit_code, 0);

    // A resize sends SIGWINCH to the foreground process group, which then sees the new
    // size; ^C ends it.
    let script = "trap 'stty size; echo winched' WINCH; echo ready; while :; do sleep 0.1; done";
    let (mut events, pty) = start_argv(&svc, &sbx.id, &["sh", "-c", script]).await;
    until(&mut events, "ready\r\n").await;
    svc.resize_pty(Request::new(ResizePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.clone(),
        rows: 33,
        cols: 101,
    }))
    .await
    .unwrap();
    until(&mut events, "33 101\r\nwinched").await;
    svc.write_pty(Request::new(write(&pty, "\x03")))
        .await
        .unwrap();
    assert_eq!(exit_of(&mut events).await.exit_code, 130);
}

#[tokio::test]
async fn a_session_command_that_grows_the_workspace_past_its_limit_is_stopped() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.limits = Some(forkyard_proto::sandbox::v1::SandboxLimits {
        disk_bytes: 32 << 20,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.expect("create");
    let svc = SandboxService::new(f.core.clone());
    let (mut events, _) = start_argv(
        &svc,
        &sbx.id,
        &["sh", "-c", "fallocate -l 64M big; echo filled; sleep 60"],
    )
    .await;
    // Stopped long before its sleep ended.
    let exit = exit_of(&mut events).await;
    assert!(exit.workspace_over_limit, "{exit:?}");
    assert_eq!(exit.exit_code, -1, "{exit:?}");
}
